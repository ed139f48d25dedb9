"""Spans as JSON lines in a directory, one file per process: tracing without a collector, for the
Serve tests (which read the spans of every replica back) and for a look at one machine's traces.

One file per process because replicas of every deployment write at once, and lines appended by
several processes to one file may interleave.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def span_record(span: Any) -> dict[str, Any]:
    """One finished span (the SDK's `ReadableSpan`) as a JSON object."""
    context = span.get_span_context()
    parent = span.parent
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": format(context.trace_id, "032x"),
        "span_id": format(context.span_id, "016x"),
        "parent_span_id": format(parent.span_id, "016x") if parent is not None else None,
        "parent_remote": bool(parent is not None and parent.is_remote),
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "links": [
            {"trace_id": format(link.context.trace_id, "032x"), "span_id": format(link.context.span_id, "016x")}
            for link in span.links
        ],
        "resource": dict(span.resource.attributes),
    }


def span_file_exporter(directory: str | os.PathLike[str]) -> Any:
    """The SDK's console exporter writing this process's spans, a JSON object a line, to its own
    file in `directory` (the batch processor exports from one thread, so the lines do not mix)."""
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    out = open(folder / f"spans-{os.getpid()}.jsonl", "a", encoding="utf-8")  # noqa: SIM115 (the process's lifetime)
    return ConsoleSpanExporter(out=out, formatter=lambda span: json.dumps(span_record(span), default=str) + "\n")


def read_spans(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every span the processes wrote to `directory` so far (a line being written is skipped)."""
    spans = []
    for path in sorted(Path(directory).glob("spans-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                spans.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return spans
