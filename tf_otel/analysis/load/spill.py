"""Trace files read once and kept on disk by trace, so the analysis holds one step at a time.

Usage::

    with load_spilled(["traces/"]) as source:        # a TraceSource (analysis.trace_source)
        result = analyze_source(source, source="traces/")
        spans = source.spans(trace_id)                # one trace's spans, in input order
        skeleton = source.skeleton(trace_id)          # its skeleton, the rest read by rank

Each file (big ones in parts, as ``files.plan_parts`` cuts them) is decoded in blocks of whole
lines (``BLOCK_BYTES``); each block's spans are grouped by trace and written, marshalled, to a
spill file of that part in a private temporary directory (``TMPDIR``; removed on close): each
piece its skeleton first (``analysis.skeleton.split_rows``), then all its rows. What stays in
memory is the index: trace id -> where its pieces are. Peak memory is then one block per
reading process and one step in the analysis, however long the job; the price is writing and
reading the decoded spans once more (about a third of the JSON's size on disk, a tenth more
for the skeletons on the bench's traces).

A file that is one JSON document (pretty-printed, a Jaeger download) is decoded whole, as
``files.load_file_rows`` does; errors are the same as the in-memory loader's.

A backend's answers (``load.jaeger.jaeger_batches``, ``load.tempo.tempo_batches``: a trace or a
search page at a time) are spilled the same way as they come (``spill_batches``), so memory
holds one answer, not the selection::

    with spill_batches(tempo_batches(url, job_id="j"), url) as source: ...
"""

from __future__ import annotations

import marshal
import os
import shutil
import tempfile
import zlib
from array import array
from collections import OrderedDict
from operator import itemgetter
from pathlib import Path
from typing import BinaryIO, Dict, Iterable, Iterator, List, Optional, Set, Tuple

from tf_otel.analysis.engine import Engine, open_engine
from tf_otel.analysis.errors import AnalysisError
from tf_otel.analysis.load.decoders import block_spiller
from tf_otel.analysis.load.files import (
    Part,
    Skip,
    decode_line_block,
    find_trace_files,
    input_size,
    load_part_rows,
    open_trace_file,
    plan_parts,
    requested_workers,
    say_skips,
)
from tf_otel.analysis.load.heap import hold_block_buffers
from tf_otel.analysis.load.otlp_native import SpilledBlock
from tf_otel.analysis.load.progress import Progress
from tf_otel.analysis.model import Row, Span, add_spans, by_trace
from tf_otel.analysis.rules.gc_pause import paused_gc
from tf_otel.analysis.skeleton import SKELETON_SETS, Skeleton, split_rows

BLOCK_BYTES = 8 << 20  # whole lines decoded at once: bounds a reading process's memory
_MAX_OPEN = 128  # spill files kept open for reading (a directory of thousands of rank files)

# a trace's pieces, flat: (spill file number, offset, skeleton length, rows length) of each in
# turn (its rows, all of them, follow its skeleton); an array costs 32 bytes a piece where
# tuples of ints cost ~130 (64 pieces a step at 64 ranks)
TracePieces = array
PIECE = 4  # numbers a piece
# one part's pieces in order: (trace id, offset, skeleton length, rows length)
Pieces = List[Tuple[str, int, int, int]]


def _blocks(part: Part) -> Iterator[Tuple[bytes, int, int]]:
    """The part's whole lines in blocks: (data, where its whole lines end, where it begins in
    the file). Each read of ``BLOCK_BYTES`` is decoded in place up to its last newline and the
    rest of that line follows as a small block of its own: joining the blocks' ends to the next
    read copied 8 MiB twice a block, and the allocator's heap grew with the copies (63 -> 80 MB
    over 64 parts of 47 MB)."""
    path, start, end = part
    at = start
    with open_trace_file(path) as handle:
        if start:
            handle.seek(start)
        left = None if end < 0 else end - start
        while left is None or left > 0:
            data = handle.read(BLOCK_BYTES if left is None else min(BLOCK_BYTES, left))
            if not data:
                break
            if left is not None:
                left -= len(data)
            cut = data.rfind(b"\n") + 1
            if cut == len(data):
                yield data, cut, at
                at += cut
                continue
            tail = handle.readline()  # parts end at a line's end: never past ``end``
            if left is not None:
                left -= len(tail)
            if cut:
                yield data, cut, at
                at += cut
            rest = data[cut:] + tail
            del data
            yield rest, len(rest), at
            at += len(rest)


def _write(out: BinaryIO, rows: List[Row], pieces: Pieces, jobs: Set[str]) -> int:
    for trace_id, group in by_trace(rows, _TRACE_ID).items():
        skeleton = marshal.dumps(split_rows(group))
        every = marshal.dumps(group)
        pieces.append((trace_id, out.tell(), len(skeleton), len(every)))
        out.write(skeleton)
        out.write(every)
    jobs.update(map(_JOB_ID, rows))
    jobs.discard(None)
    return len(rows)


def _write_spilled(out: BinaryIO, spilled: SpilledBlock, pieces: Pieces, jobs: Set[str]) -> int:
    """A block the native decoder spilled itself (``_write``'s pieces, made without rows)."""
    lengths, data, named, count = spilled
    offset = out.tell()
    out.write(data)
    for trace_id, skeleton, every in lengths:
        pieces.append((trace_id, offset, skeleton, every))
        offset += skeleton + every
    jobs.update(named)
    return count


# A piece stays lists of row tuples: marshalled by column (times as int64 bytes) it loaded in
# two thirds of the time, but the spans made of it, their fields allocated column by column, made
# the analysis of each step ~30 % slower (bench s25: 1.8-1.9 s against 1.3-1.6 s of CPU).
_TRACE_ID, _JOB_ID = itemgetter(0), itemgetter(11)


def spill_part(task: Tuple[Part, str, bool]) -> bytes:
    """Decode one part into its spill file; the pieces, job ids, span count and the lines
    skipped (not strict: ``files.Skip``), marshalled."""
    part, target, strict = task
    hold_block_buffers()  # in whichever process decodes (a Dask worker too)
    pieces: Pieces = []
    jobs: Set[str] = set()
    count = 0
    skips: Optional[List[Skip]] = None if strict else []
    # the native decoder writes a block's pieces itself where it reads every line of it (no
    # Python object per span); else the block's rows are decoded line by line and written. A
    # decoder a block: its caches (attribute lists, ids) last a block, as the rows' do
    with paused_gc(), open(target, "wb") as out:
        try:
            for block, stop, at in _blocks(part):
                spiller = block_spiller()
                spilled = None
                if spiller is not None:
                    spilled = spiller.spill_block(block, stop, SKELETON_SETS)
                if spilled is not None:
                    count += _write_spilled(out, spilled, pieces, jobs)
                    continue
                rows = decode_line_block(part[0], block, stop, skips, at)
                count += _write(out, rows, pieces, jobs)
        except (AnalysisError, OSError, EOFError, zlib.error):
            count = -1  # decoded again whole below: the error names the file and line
        if count <= 0:  # no spans, an error, or one JSON document: read as the loader does
            out.seek(0)
            out.truncate()
            pieces.clear()
            skips = None if strict else []
            count = _write(out, load_part_rows(part, strict, skips), pieces, jobs)
    return marshal.dumps((pieces, sorted(jobs), count, skips or []))


class _SpillFiles:
    """The spill files open for reading in this process (a bounded cache of descriptors),
    shared by a source and its views."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._open: OrderedDict[int, int] = OrderedDict()  # spill file number -> descriptor

    def read(self, number: int, offset: int, length: int) -> bytes:
        descriptor = self._open.get(number)
        if descriptor is None:
            if len(self._open) >= _MAX_OPEN:
                os.close(self._open.popitem(last=False)[1])
            descriptor = os.open(self.directory / f"{number}.spill", os.O_RDONLY)
            self._open[number] = descriptor
        else:
            self._open.move_to_end(number)
        return os.pread(descriptor, length, offset)

    def close(self) -> None:
        for descriptor in self._open.values():
            os.close(descriptor)
        self._open.clear()

    def __del__(self) -> None:
        self.close()


class SpillSource:
    """The spilled spans of a job's trace files (``analysis.trace_source.TraceSource``)."""

    fresh = True

    def __init__(
        self,
        directory: Path,
        index: Dict[str, TracePieces],
        jobs: Set[str],
        files: Optional[_SpillFiles] = None,
    ) -> None:
        self.directory = directory
        self.span_count = 0
        # what loading said about the input (lines skipped): the report's warnings begin so
        self.load_warnings: List[str] = []
        self.owner = files is None  # removes the directory on close (a view does not)
        self._index = index
        self._jobs = jobs
        self._files = files or _SpillFiles(directory)

    def view(self, trace_ids: List[str]) -> SpillSource:
        """These traces only: what an engine's worker needs to read them (pickled small)."""
        index = {t: self._index[t] for t in trace_ids if t in self._index}
        return SpillSource(self.directory, index, self._jobs, self._files)

    def __getstate__(self) -> Dict[str, object]:
        state = dict(self.__dict__)
        state["_files"] = None  # descriptors stay with their process
        state["owner"] = False
        return state

    def __setstate__(self, state: Dict[str, object]) -> None:
        self.__dict__.update(state)
        self._files = _SpillFiles(self.directory)

    def trace_ids(self) -> List[str]:
        return list(self._index)

    def job_ids(self) -> Set[str]:
        return set(self._jobs)

    def spans(self, trace_id: str) -> List[Span]:
        spans: List[Span] = []
        pieces = self._index.get(trace_id, ())
        read = self._files.read
        for at in range(0, len(pieces), PIECE):
            number, offset, head, length = pieces[at : at + PIECE]
            add_spans(spans, marshal.loads(read(number, offset + head, length)))
        return spans

    def skeleton(self, trace_id: str) -> Skeleton:
        """The trace's skeleton (``analysis.skeleton``); its rest is read per rank."""
        skeleton = Skeleton(self._files.read)
        pieces = self._index.get(trace_id, ())
        read = self._files.read
        for at in range(0, len(pieces), PIECE):
            number, offset, head, length = pieces[at : at + PIECE]
            skeleton.add(marshal.loads(read(number, offset, head)), (number, offset + head, length))
        return skeleton

    def close(self) -> None:
        if self.owner:
            self._files.close()
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> SpillSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_spilled(
    paths: Iterable[str],
    progress: Optional[bool] = None,
    workers: Optional[int] = None,
    engine: Optional[Engine] = None,
    spill_dir: Optional[str] = None,
    strict: bool = True,
) -> SpillSource:
    """Every trace file under ``paths`` read into a ``SpillSource`` (close it when done);
    ``engine`` decodes the parts (default: one chosen for ``workers`` and the input's size,
    closed before returning); ``spill_dir``: where the spill goes (default: ``TMPDIR``). Not
    ``strict``: lines that are not JSON are skipped, each said on stderr and in the source's
    ``load_warnings`` (``files.skip_note``)."""
    paths = list(paths)
    files = find_trace_files(paths)
    if engine is None:
        with open_engine(requested_workers(workers), None, input_size(files)) as own:
            return _spill(paths, files, progress, own, spill_dir, strict)
    return _spill(paths, files, progress, engine, spill_dir, strict)


def _spill(
    paths: List[str],
    files: List[Path],
    progress: Optional[bool],
    engine: Engine,
    spill_dir: Optional[str],
    strict: bool = True,
) -> SpillSource:
    parts = plan_parts(files, max(engine.workers, 1))  # blocks, not parts, bound the memory
    directory = _spill_directory(spill_dir)
    tasks = [
        (part, str(directory / f"{number}.spill"), strict) for number, part in enumerate(parts)
    ]
    skips: List[Skip] = []
    index: Dict[str, TracePieces] = {}
    jobs: Set[str] = set()
    source = SpillSource(directory, index, jobs)
    try:
        with Progress("reading trace files", len(parts), progress) as bar:
            for number, blob in enumerate(engine.map(spill_part, tasks)):
                pieces, part_jobs, count, part_skips = marshal.loads(blob)
                skips.extend(part_skips)
                for trace_id, offset, head, rest in pieces:
                    found = index.get(trace_id)
                    if found is None:
                        found = index[trace_id] = array("q")
                    found.extend((number, offset, head, rest))
                jobs.update(part_jobs)
                source.span_count += count
                bar.advance()
    except BaseException:
        source.close()
        raise
    source.load_warnings = say_skips(skips)
    if not source.span_count:
        source.close()
        raise AnalysisError(f"{', '.join(map(str, paths))}: no spans")
    return source


def _spill_directory(spill_dir: Optional[str]) -> Path:
    try:
        return Path(tempfile.mkdtemp(prefix="tf-otel-spill-", dir=spill_dir))
    except OSError as error:
        raise AnalysisError(
            f"{spill_dir or tempfile.gettempdir()}: cannot spill ({error})"
        ) from None


def spill_backend(
    kind: str,
    url: str,
    job_id: Optional[str],
    service: Optional[str] = None,
    start_ns: Optional[int] = None,
    end_ns: Optional[int] = None,
    limit: int = 10000,
    trace_ids: Optional[List[str]] = None,
    progress: Optional[bool] = None,
    spill_dir: Optional[str] = None,
) -> SpillSource:
    """A job's traces as Jaeger or Tempo (``kind``) at ``url`` holds them, searched by its job id
    (``job_id`` may name an attempt, "<job id>@<attempt>": the backends know jobs, not
    attempts), kept on disk by trace as they come (``spill_batches``)."""
    from tf_otel.analysis.load.jaeger import jaeger_batches
    from tf_otel.analysis.load.tempo import tempo_batches
    from tf_otel.analysis.model import base_job

    job = base_job(job_id) if job_id else None
    if kind == "jaeger":
        batches = jaeger_batches(url, service, job, start_ns, end_ns, limit, trace_ids, progress)
    else:
        batches = tempo_batches(url, job, start_ns, end_ns, limit, trace_ids, progress)
    origin = f"{url} (job {job_id})" if job_id else url  # named where there are no spans
    return spill_batches(batches, origin, spill_dir)


def spill_batches(
    batches: Iterable[List[Span]], origin: str, spill_dir: Optional[str] = None
) -> SpillSource:
    """Spans that come in batches (a backend's answers) kept on disk by trace as they come, in
    one spill file: memory holds one batch. A trace may span several batches."""
    directory = _spill_directory(spill_dir)
    index: Dict[str, TracePieces] = {}
    jobs: Set[str] = set()
    source = SpillSource(directory, index, jobs)
    pieces: Pieces = []
    try:
        with paused_gc(), open(directory / "0.spill", "wb") as out:
            for batch in batches:
                source.span_count += _write(out, [span.to_row() for span in batch], pieces, jobs)
                for trace_id, offset, head, rest in pieces:
                    found = index.get(trace_id)
                    if found is None:
                        found = index[trace_id] = array("q")
                    found.extend((0, offset, head, rest))
                pieces.clear()
    except BaseException:
        source.close()
        raise
    if not source.span_count:
        source.close()
        raise AnalysisError(f"{origin}: no spans")
    return source
