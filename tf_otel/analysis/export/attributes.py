"""Every attribute of the exported spans, read again from the trace files.

The analysis loader keeps only the attributes the analysis reads (decoding all of them was a
third of the load time); the export shows them all, but only for the few steps it writes, so
it reads the files a second time and decodes the attributes of those traces' spans alone.

Usage::

    attrs = full_attributes(["traces/"], {"4bf9...": ...})  # (trace id, span id) -> dict
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Collection, Dict, Iterable, Iterator, Optional, Tuple

from tf_otel.analysis.load._json import DECODE_ERRORS, loads
from tf_otel.analysis.load.files import find_trace_files, open_trace_file, read_trace_bytes
from tf_otel.analysis.load.otlp import MALFORMED, is_traces_data, normalise_id
from tf_otel.analysis.load.progress import Progress
from tf_otel.analysis.otlp_values import attributes_dict

Key = Tuple[str, str]  # (trace id, span id), lowercase hex


def _documents(path: Path) -> Iterator[Any]:
    """The JSON documents of a file, read a line at a time: one per line, or the whole file
    where its first line is not one (pretty-printed)."""
    first = True
    with open_trace_file(path) as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                document = loads(line)
            except DECODE_ERRORS:
                if first:
                    try:
                        document = loads(read_trace_bytes(path))
                    except DECODE_ERRORS:
                        return
                    yield document
                    return
                continue  # the loader already accepted the file: a torn last line
            first = False
            yield document


def _spans(document: Any) -> Iterator[Any]:
    if not is_traces_data(document):
        return  # a Jaeger document: its spans already carry every tag
    for resource_spans in document.get("resourceSpans") or document.get("batches") or ():
        scopes = resource_spans.get("scopeSpans")
        if scopes is None:
            scopes = resource_spans.get("instrumentationLibrarySpans") or ()
        for scope in scopes:
            yield from scope.get("spans") or ()


def full_attributes(
    paths: Iterable[str], trace_ids: Collection[str], progress: Optional[bool] = None
) -> Dict[Key, Dict[str, Any]]:
    """All attributes of every span of ``trace_ids`` found in the files under ``paths``."""
    wanted = set(trace_ids)
    found: Dict[Key, Dict[str, Any]] = {}
    files = find_trace_files(paths)
    with Progress("export: reading span attributes", len(files), progress) as bar:
        for path in files:
            for document in _documents(path):
                for raw in _spans(document):
                    try:
                        trace_id = normalise_id(raw["traceId"], 16)
                        if trace_id not in wanted:
                            continue
                        span_id = normalise_id(raw["spanId"], 8) or ""
                        found[(trace_id, span_id)] = attributes_dict(raw.get("attributes"))
                    except MALFORMED:
                        continue  # the loader decided about this span already
            bar.advance()
    return found
