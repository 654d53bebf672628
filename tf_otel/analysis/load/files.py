"""OTLP-JSON trace files: ``TF_OTEL_FILE`` output and the Collector's file exporter.

One ``TracesData`` object per line (optionally gzip-compressed), or one whole-file JSON object
(a pretty-printed ``TracesData``, or a Jaeger UI download). Directories are searched for
``*.json``, ``*.jsonl``, ``*.otlp`` (``.gz`` too).

A line that is not JSON (a record a killed process was writing when it died, cut short, in a
plain or a gzip file; a corrupt line) is skipped with a note (``Skip``, ``skip_note``: the file,
the byte offset and what was lost) and everything else is read; ``strict=True`` raises
``AnalysisError`` on it instead, naming the file and the line. A file whose lines are all
unreadable is still an error unless they begin as trace records do (a short job's one record,
cut short).

Usage::

    spans = load_paths(["traces/", "rank0.jsonl.gz"])
    spans = load_paths(["traces/"], strict=True)       # a bad line: AnalysisError
"""

from __future__ import annotations

import gzip
import marshal
import sys
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Dict, Iterable, List, Optional, Tuple

from tf_otel.analysis.engine import Engine, engine_workers, open_engine
from tf_otel.analysis.errors import AnalysisError
from tf_otel.analysis.load._json import DECODE_ERRORS, loads
from tf_otel.analysis.load.decoders import line_decoders
from tf_otel.analysis.load.jaeger import convert_jaeger_traces, is_jaeger_document
from tf_otel.analysis.load.otlp import decode_traces_rows, is_traces_data
from tf_otel.analysis.load.progress import Progress
from tf_otel.analysis.model import Row, Span, add_spans
from tf_otel.analysis.rules.gc_pause import paused_gc

TRACE_SUFFIXES = (".json", ".jsonl", ".ndjson", ".otlp")
_MAGIC = {b"\x89PNG": "a PNG image", b"%PDF": "a PDF", b"PK\x03\x04": "a zip archive"}


def _holds_nothing(path: Path) -> bool:
    """A file with no bytes but whitespace (a ps task's TF_OTEL_FILE: it runs no steps)."""
    try:
        size = path.stat().st_size
        if size > 4096:
            return False
        return size == 0 or not read_trace_bytes(path).strip()
    except (OSError, AnalysisError):
        return False  # reported when read


def find_trace_files(paths: Iterable[str]) -> List[Path]:
    """Trace files named or found under directories. Files found in a directory that hold no
    spans are passed over with one line naming them; a file named on its own is always read."""
    files: List[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(
                p
                for p in path.rglob("*")
                if p.is_file() and p.name.lower().removesuffix(".gz").endswith(TRACE_SUFFIXES)
            )
            if not found:
                raise AnalysisError(f"{path}: no trace files (*.json, *.jsonl, *.otlp) in it")
            empty = [p for p in found if _holds_nothing(p)]
            if empty and len(empty) == len(found):
                raise AnalysisError(f"{path}: every trace file in it is empty")
            if empty:
                names = ", ".join(str(p.relative_to(path)) for p in empty[:10])
                more = f" and {len(empty) - 10} more" if len(empty) > 10 else ""
                print(
                    f"tf-otel: {path}: passing over {len(empty)} file(s) with no spans "
                    f"(a ps task runs no steps): {names}{more}",
                    file=sys.stderr,
                )
            files.extend(p for p in found if p not in empty)
        elif path.is_file():
            files.append(path)
        else:
            raise AnalysisError(f"{path}: no such file or directory")
    return files


def open_trace_file(path: Path) -> BinaryIO:
    """A trace file open for reading its (gunzipped) bytes as they are needed."""
    try:
        handle: BinaryIO = open(path, "rb")  # noqa: SIM115 - returned to a with block
        if handle.read(2) == b"\x1f\x8b":
            handle.close()
            return gzip.open(path, "rb")  # type: ignore[return-value]
        handle.seek(0)
        return handle
    except OSError as error:
        raise AnalysisError(f"{path}: cannot read ({error})") from None


def read_trace_bytes(path: Path, lenient: bool = False) -> bytes:
    """A trace file's bytes (gunzipped); one AnalysisError for anything that is not one.
    ``lenient``: a gzip file cut short (a process killed while writing it) or broken gives what
    it holds before the cut; its last line, cut short too, is then skipped as a plain file's."""
    try:
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = _gunzip_what_there_is(data) if lenient else gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as error:
        raise AnalysisError(f"{path}: cannot read ({error})") from None
    for magic, what in _MAGIC.items():
        if data.startswith(magic):
            raise AnalysisError(f"{path}: not a trace file ({what})")
    if b"\x00" in data[:4096]:
        raise AnalysisError(f"{path}: not a trace file (binary data)")
    return data


_GZIP_CHUNK = 1 << 20  # compressed bytes fed at a time: a break keeps what came before it


def _gunzip_what_there_is(data: bytes) -> bytes:
    """Every gzip member of ``data`` decompressed, as far as the bytes go: a member cut short
    or broken ends the output there. Raises zlib.error where not one byte comes out (no
    gzip data at all)."""
    out: List[bytes] = []
    rest = data
    while rest[:2] == b"\x1f\x8b":
        member = zlib.decompressobj(wbits=31)  # one gzip member, header and trailer checked
        at = 0
        try:
            while at < len(rest) and not member.eof:
                out.append(member.decompress(rest[at : at + _GZIP_CHUNK]))
                at += _GZIP_CHUNK
        except zlib.error:
            if not any(out):
                raise
            break
        if not member.eof:
            break  # cut short: what it gave is all there is
        rest = member.unused_data + rest[at:]  # the next member, if any
    return b"".join(out)


def _foreign(obj: Any) -> Optional[str]:
    """What a parsed JSON document is, when it is a known non-OTLP format."""
    if isinstance(obj, dict) and "traceEvents" in obj:
        return "a Chrome trace / TensorBoard profile, not OTLP-JSON"
    if isinstance(obj, list) and obj and isinstance(obj[0], dict) and "ph" in obj[0]:
        return "a Chrome trace event list, not OTLP-JSON"
    return None


def _decode_document(obj: Any, origin: str) -> List[Row]:
    if is_traces_data(obj):
        return decode_traces_rows(obj, origin)
    if is_jaeger_document(obj):
        return [span.to_row() for span in convert_jaeger_traces(obj["data"], origin)]
    what = _foreign(obj) or "JSON without 'resourceSpans'"
    raise AnalysisError(f"{origin}: not OTLP-JSON ({what})")


# A line skipped for not being JSON: (file, its byte offset in the file's (gunzipped) bytes, its
# length, the spans begun in it, whether it is the file's last line cut short). Marshalled from
# a worker as it is.
Skip = Tuple[str, int, int, int, bool]
_SPAN_BEGINS = b'"spanId"'  # each span of a TracesData line names its id once
_RECORD_START = b'{"resourceSpans"'  # how the records tf_otel and the Collector write begin
SKIP_NOTES_PER_FILE = 3  # lines a file's skips get on stderr; the rest are counted


def skip_note(skip: Skip) -> str:
    """The one line that says what a skipped line cost."""
    path, offset, length, spans, torn = skip
    where = f"byte {offset:,}" + (" (uncompressed)" if path.lower().endswith(".gz") else "")
    lost = f"{length:,} bytes, {spans:,} span(s) begun in it, lost"
    if torn:
        return (
            f"{path}: {where}: skipped its last record, cut short ({lost}): the process "
            "stopped while writing it"
        )
    return f"{path}: {where}: skipped a line that is not valid JSON ({lost})"


def skip_notes(skips: Iterable[Skip]) -> List[str]:
    """The notes of ``skips``: at most ``SKIP_NOTES_PER_FILE`` a file, then one that counts the
    rest."""
    notes: List[str] = []
    by_file: Dict[str, List[Skip]] = {}
    for skip in skips:
        by_file.setdefault(skip[0], []).append(skip)
    for path, found in by_file.items():
        notes.extend(skip_note(skip) for skip in found[:SKIP_NOTES_PER_FILE])
        if len(found) > SKIP_NOTES_PER_FILE:
            rest = found[SKIP_NOTES_PER_FILE:]
            notes.append(
                f"{path}: {len(rest):,} more line(s) skipped ({sum(s[2] for s in rest):,} bytes, "
                f"{sum(s[3] for s in rest):,} span(s) begun in them, lost)"
            )
    return notes


def say_skips(skips: Iterable[Skip]) -> List[str]:
    """Each note on stderr (``tf-otel: <note>``); the notes, for the report's warnings."""
    notes = skip_notes(skips)
    for note in notes:
        print(f"tf-otel: {note}", file=sys.stderr)
    return notes


def load_file(path: Path, strict: bool = True, skips: Optional[List[Skip]] = None) -> List[Span]:
    spans: List[Span] = []
    add_spans(spans, load_file_rows(path, strict, skips))
    return spans


def load_file_rows(
    path: Path, strict: bool = True, skips: Optional[List[Skip]] = None
) -> List[Row]:
    """One file's spans as ``model.Row``s; not ``strict``: lines that are not JSON are skipped
    and added to ``skips``."""
    data = read_trace_bytes(path, lenient=not strict)
    found: Optional[List[Skip]] = None if strict else []
    try:
        spans = _decode_lines(path, data, skips=found)
    except _NotLines as not_lines:
        return _load_whole(path, data, not_lines.line, not_lines.line_count, found, skips)
    if not spans and not data.strip():
        raise AnalysisError(f"{path}: empty file")
    if skips is not None and found:
        skips.extend(found)
    return spans


class _NotLines(Exception):
    """A line that is not JSON before any span: maybe the file is one pretty-printed document."""

    def __init__(self, line: int, line_count: int) -> None:
        super().__init__(line)
        self.line, self.line_count = line, line_count


def _line_bounds(data: bytes, stop: int) -> Optional[List[Tuple[int, int]]]:
    """Where each of ``data[:stop].splitlines()`` begins and ends, found without copying the
    lines; None where a line may end in a carriage return (then ``splitlines`` itself splits)."""
    if data.find(b"\r", 0, stop) >= 0:
        return None
    bounds: List[Tuple[int, int]] = []
    start = 0
    while start < stop:
        end = data.find(b"\n", start, stop)
        end = stop if end < 0 else end
        bounds.append((start, end))
        start = end + 1
    return bounds


def _split_bounds(data: bytes, stop: int) -> List[Tuple[int, int]]:
    """``_line_bounds`` where lines may end in carriage returns: as ``splitlines`` splits."""
    bounds: List[Tuple[int, int]] = []
    start = 0
    for line in data[:stop].splitlines(keepends=True):
        bounds.append((start, start + len(line.rstrip(b"\r\n"))))
        start += len(line)
    return bounds


def _decode_lines(
    path: Path,
    data: bytes,
    first_line: int = 1,
    stop: Optional[int] = None,
    skips: Optional[List[Skip]] = None,
    base: int = 0,
    skip_any: bool = False,
) -> List[Row]:
    """Spans of newline-delimited ``TracesData`` lines (numbered from ``first_line``) in
    ``data[:stop]``: each line on the fastest decoder that takes it (``decoders``), else on the
    reference path, which names the error. With ``skips`` a line that is not JSON is skipped and
    added to it (``base``: where ``data`` begins in the file), except one before any span that
    does not begin as a record does (maybe the file is one pretty-printed document; any, with
    ``skip_any``)."""
    stop = len(data) if stop is None else stop
    bounds = _line_bounds(data, stop) or _split_bounds(data, stop)
    fast = line_decoders(data)
    spans: List[Row] = []
    for number, (begin, end) in enumerate(bounds, start=first_line):
        rows = None
        for decoder in fast:
            rows = decoder.decode(data, begin, end)
            if rows is not None:
                break
        if rows is not None:
            spans.extend(rows)
            continue
        whole = data[begin:end]
        if not whole.strip():
            continue
        try:
            obj = loads(whole)
        except DECODE_ERRORS:
            lenient = skips is not None
            if lenient and (spans or skip_any or whole.lstrip().startswith(_RECORD_START)):
                at = number - first_line
                torn = at == len(bounds) - 1 and data[stop - 1 : stop] not in (b"\n", b"\r")
                skip = (str(path), base + begin, len(whole), whole.count(_SPAN_BEGINS), torn)
                skips.append(skip)  # type: ignore[union-attr]
                continue
            if not spans:
                raise _NotLines(number, len(bounds)) from None
            raise _bad_line(path, number) from None
        spans.extend(_decode_document(obj, f"{path} line {number}"))
    return spans


def decode_line_block(
    path: Path,
    block: bytes,
    stop: Optional[int] = None,
    skips: Optional[List[Skip]] = None,
    base: int = 0,
) -> List[Row]:
    """Spans of a block of whole ``TracesData`` lines from ``path`` (``block[:stop]``, read
    without a copy). Raises ``AnalysisError`` on any line that is not one, without its number:
    the caller decodes the whole part again (``load_part_rows``) for the exact error, or as one
    JSON document. With ``skips``, as ``_decode_lines`` (``base``: the block's offset in the
    file; past the file's first line any line that is not JSON is skipped)."""
    try:
        return _decode_lines(path, block, 1, stop, skips, base, skip_any=base > 0)
    except _NotLines:
        raise AnalysisError(f"{path}: not newline-delimited OTLP-JSON") from None


def _bad_line(path: Path, number: int) -> AnalysisError:
    return AnalysisError(f"{path}: line {number} is not valid JSON (truncated or corrupt file)")


def _load_whole(
    path: Path,
    data: bytes,
    bad_line: int,
    line_count: int,
    found: Optional[List[Skip]] = None,
    skips: Optional[List[Skip]] = None,
) -> List[Row]:
    """A file whose first line is not JSON: maybe one pretty-printed document. ``found`` (not
    strict): its lines are read again, any line that is not JSON skipped, where the document is
    not JSON either and they give spans."""
    try:
        obj = loads(data)
    except DECODE_ERRORS:
        if found is not None:
            found.clear()
            spans = _decode_lines(path, data, skips=found, skip_any=True)
            if spans:
                if skips is not None:
                    skips.extend(found)
                return spans
        if line_count == 1 or bad_line > 1:
            raise _bad_line(path, bad_line) from None
        raise AnalysisError(f"{path}: not valid JSON (truncated, corrupt or not a trace)") from None
    return _decode_document(obj, str(path))


# A big plain file is read in parts by several workers: (path, first byte, end byte); the
# whole file is (path, 0, -1). Parts start at line starts, so each is whole TracesData lines.
Part = Tuple[Path, int, int]
PART_MIN_BYTES = 16 << 20
PARTS_PER_WORKER = 8


def plan_parts(files: List[Path], workers: int) -> List[Part]:
    """Files in order; big newline-delimited ones are cut so that there are about
    ``PARTS_PER_WORKER`` parts per worker (a short tail when the last parts finish)."""
    sizes = [_size(path) for path in files]
    target = max(PART_MIN_BYTES, sum(sizes) // max(1, workers * PARTS_PER_WORKER))
    parts: List[Part] = []
    for path, size in zip(files, sizes):
        if workers > 1 and size >= 1.5 * target and _splittable(path):
            parts.extend(_cut(path, size, target))
        else:
            parts.append((path, 0, -1))
    return parts


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # reported when read


def _splittable(path: Path) -> bool:
    """Plain (not gzip) newline-delimited JSON: the first line is a whole JSON document."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(2)
            first = head + handle.readline(64 << 20)
    except OSError:
        return False
    if head == b"\x1f\x8b" or not first.endswith(b"\n"):
        return False
    try:
        loads(first)
    except DECODE_ERRORS:
        return False
    return True


def _cut(path: Path, size: int, target: int) -> List[Part]:
    bounds = [0]
    with open(path, "rb") as handle:
        count = round(size / target)
        for offset in (size * n // count for n in range(1, count)):
            if offset <= bounds[-1]:
                continue
            handle.seek(offset - 1)
            rest = handle.readline()  # to the end of the line holding byte offset - 1
            cut = offset - 1 + len(rest)
            if bounds[-1] < cut < size:
                bounds.append(cut)
    bounds.append(size)
    return [(path, start, end) for start, end in zip(bounds, bounds[1:])]


def load_part_rows(
    part: Part, strict: bool = True, skips: Optional[List[Skip]] = None
) -> List[Row]:
    """The spans of one part of a file (``plan_parts``); not ``strict``: lines that are not
    JSON skipped and added to ``skips``."""
    path, start, end = part
    if start == 0 and end < 0:
        return load_file_rows(path, strict, skips)
    try:
        with open(path, "rb") as handle:
            handle.seek(start)
            data = handle.read(end - start)
    except OSError as error:
        raise AnalysisError(f"{path}: cannot read ({error})") from None
    if not strict:  # a later part of a file whose first line is JSON: any bad line is skipped
        found: List[Skip] = []
        rows = _decode_lines(path, data, skips=found, base=start, skip_any=start > 0)
        if skips is not None:
            skips.extend(found)
        return rows
    try:
        return _decode_lines(path, data)
    except (AnalysisError, _NotLines):
        pass
    # an error: decode again with line numbers counted from the start of the file
    with open(path, "rb") as handle:
        first_line = handle.read(start).count(b"\n") + 1
    try:
        _decode_lines(path, data, first_line)
    except _NotLines as not_lines:  # the file's first line was JSON: this one is corrupt
        raise _bad_line(path, not_lines.line) from None
    raise AssertionError("a part decoded differently twice")  # pragma: no cover


def _load_rows(task: Tuple[Part, bool]) -> bytes:
    """In a worker process: one part's spans as marshalled rows (half pickle's cost; rows hold
    only JSON types) and the lines skipped. An ``AnalysisError`` travels back to the parent as
    is."""
    part, strict = task
    skips: List[Skip] = []
    with paused_gc():
        return marshal.dumps((load_part_rows(part, strict, skips), skips))


def requested_workers(workers: Optional[int]) -> int:
    """The worker processes asked for: ``workers``, else ``TF_OTEL_ANALYZE_WORKERS``; 0: as
    many as usable CPUs where the input is big enough (``analysis.engine``)."""
    if workers is None:
        # an analysis process has no start-up that could hand settings over: the library's
        # callers pass None for "as the environment says", read once per process
        from tf_otel.config import current

        workers = current().analyze_workers
    return max(0, workers)


def input_size(files: List[Path]) -> int:
    return sum(_size(path) for path in files)


def worker_count(files: List[Path], workers: Optional[int] = None) -> int:
    """Processes reading ``files``: 1 (this one) or the engine's workers."""
    return engine_workers(requested_workers(workers), None, input_size(files))


def load_paths(
    paths: Iterable[str],
    progress: Optional[bool] = None,
    workers: Optional[int] = None,
    engine: Optional[Engine] = None,
    strict: bool = True,
) -> List[Span]:
    """Spans of all trace files under ``paths``, in file order; with several workers the
    files (big ones in parts) are decoded by ``engine``'s worker processes (default: one
    chosen for ``workers`` and the input's size, closed before returning). Not ``strict``:
    lines that are not JSON are skipped, each said on stderr (``skip_note``)."""
    files = find_trace_files(paths)
    if engine is None:
        with open_engine(requested_workers(workers), None, input_size(files)) as own:
            return _load_files(files, progress, own, strict)
    return _load_files(files, progress, engine, strict)


def _load_files(
    files: List[Path], progress: Optional[bool], engine: Engine, strict: bool
) -> List[Span]:
    spans: List[Span] = []
    skips: List[Skip] = []
    if engine.workers <= 1:
        with paused_gc(), Progress("reading trace files", len(files), progress) as bar:
            for path in files:
                spans.extend(load_file(path, strict, skips))
                bar.advance()
        say_skips(skips)
        return spans
    parts = plan_parts(files, engine.workers)
    tasks = [(part, strict) for part in parts]
    with paused_gc(), Progress("reading trace files", len(parts), progress) as bar:
        for blob in engine.map(_load_rows, tasks):  # in file order
            rows, part_skips = marshal.loads(blob)
            add_spans(spans, rows)
            skips.extend(part_skips)
            bar.advance()
    say_skips(skips)
    return spans
