"""The spans of a folder of OTLP-JSON files (TF_OTEL_FILE) as written, every attribute kept
(the analysis' loader keeps only those it reads).

Usage::

    from otlp_files import file_spans
    for span in file_spans(folder):   # {"name", "trace", "id", "parent", "rank", "start_ns",
        ...                           #  "attributes"}
        ...
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

from tf_otel import record
from tf_otel.analysis.otlp_values import attributes_dict


def file_spans(folder: Path) -> List[Dict[str, Any]]:
    out = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            for resource_spans in json.loads(line).get("resourceSpans", []) if line else []:
                resource = attributes_dict(resource_spans["resource"].get("attributes"))
                for scope_spans in resource_spans.get("scopeSpans", []):
                    for span in scope_spans.get("spans", []):
                        out.append(
                            {
                                "name": span["name"],
                                "trace": span["traceId"],
                                "id": span["spanId"],
                                "parent": span.get("parentSpanId", ""),
                                "rank": resource[record.ATTR_RANK],
                                "start_ns": int(span.get("startTimeUnixNano") or 0),
                                "attributes": attributes_dict(span.get("attributes")),
                            }
                        )
    return out
