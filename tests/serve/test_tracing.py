"""Tracing through the deployed app: the test app writes every replica's spans to files
(`tracing_spans_dir`), and these tests read them back by the trace ids they sent in `traceparent`.

A context request is one trace, one tree under the caller's span, covering the ingress, the memory
operation, the query's embedding and all three stores. A call across deployments (compress: Ingress to Memorizer;
memorization: Memorizer to Embedder) keeps the trace, with the callee's span a child of the
caller's: were the context lost on the way, the callee's span would start a trace of its own and
these tests would not find it.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from serve_app.runtime.span_files import read_spans
from tests.serve.conftest import wait_memorized

pytestmark = pytest.mark.serve


def _traceparent() -> tuple[str, str, dict[str, str]]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, {"traceparent": f"00-{trace_id}-{span_id}-01"}


def _wait_spans(spans_dir: Path, done: Callable[[list[dict]], bool], timeout_s: float = 20) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    spans: list[dict] = []
    while time.monotonic() < deadline:
        spans = read_spans(spans_dir)
        if done(spans):
            return spans
        time.sleep(0.2)
    raise AssertionError(f"spans not written within {timeout_s} s; names seen: {sorted({s['name'] for s in spans})}")


def _of_trace(trace_id: str) -> Callable[[list[dict]], list[dict]]:
    return lambda spans: [s for s in spans if s["trace_id"] == trace_id]


def _deployment(span: dict) -> str:
    return span["resource"]["memserve.deployment"]


def _one_tree(trace: list[dict], caller_span: str | None) -> dict[str, dict]:
    """The trace's spans by id, after checking that each hangs from another of them or from the caller
    (None: the trace's root)."""
    by_id = {s["span_id"]: s for s in trace}
    orphans = [s["name"] for s in trace if s["parent_span_id"] not in by_id and s["parent_span_id"] != caller_span]
    assert not orphans, f"spans whose parent is not in the trace: {orphans}"
    return by_id


def _ancestors(span: dict, by_id: dict[str, dict]) -> list[str]:
    names = []
    while (span := by_id.get(span["parent_span_id"])) is not None:
        names.append(span["name"])
    return names


def test_a_context_request_is_one_trace_over_the_ingress_and_the_stores(client, spans_dir):
    user, old, new = f"trace-{uuid.uuid4().hex[:8]}", f"trace-{uuid.uuid4().hex[:8]}", f"trace-{uuid.uuid4().hex[:8]}"
    notes = [
        {"role": "user", "content": "Our cat Miso only eats the salmon pate from the blue tin."},
        {"role": "user", "content": "Miso's vet is Dr. Okafor on Elm Street."},
    ]
    client.post(f"/v1/sessions/{old}/messages", json={"user_id": user, "messages": notes}).raise_for_status()
    wait_memorized(client, old, len(notes))
    client.post(f"/v1/sessions/{new}/messages", json={"user_id": user, "messages": [{"role": "user", "content": "hi"}]})

    trace_id, caller, headers = _traceparent()
    body = {"user_id": user, "session_id": new, "query": "what does Miso eat?", "max_tokens": 2048}
    response = client.post("/v1/context", json=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.json()["recalled"]

    def complete(spans: list[dict]) -> bool:
        names = {s["name"] for s in _of_trace(trace_id)(spans)}
        return {"POST /v1/context", "memory.context", "SessionLog.uncovered", "VectorStore.search_dense_ids"} <= names

    trace = _of_trace(trace_id)(_wait_spans(spans_dir, complete))
    by_id = _one_tree(trace, caller)
    (server,) = [s for s in trace if s["parent_span_id"] == caller]
    assert server["name"] == "POST /v1/context" and server["kind"] == "SERVER" and server["parent_remote"]
    assert server["attributes"]["http.route"] == "/v1/context" and server["attributes"]["http.response.status_code"] == 200
    assert server["attributes"]["ray.serve.request_id"] == response.headers["x-request-id"]  # the access log's id
    (context,) = [s for s in trace if s["name"] == "memory.context"]
    assert by_id[context["parent_span_id"]] is server
    attributes = context["attributes"]
    assert attributes["memory.operation"] == "context" and attributes["memory.user"] == user
    assert attributes["memory.recalled"] == len(response.json()["recalled"]) >= 1
    assert attributes["memory.prompt_tokens"] == response.json()["usage"]["sections"]["memory"]["tokens"] > 0
    assert attributes["memory.degraded"] == response.json()["degraded"]
    stores = {s["attributes"]["db.system"] for s in trace if "db.system" in s["attributes"]}
    assert stores == {"redis", "postgresql", "milvus"}
    for span in trace:
        if "db.system" in span["attributes"]:
            assert "memory.context" in _ancestors(span, by_id), span["name"]


def test_calls_across_deployments_keep_the_trace(client, spans_dir):
    user, sid = f"trace-{uuid.uuid4().hex[:8]}", f"trace-{uuid.uuid4().hex[:8]}"
    turns = [{"role": "user", "content": f"Note {i}: the invoice INV-{400 + i} is due on Friday."} for i in range(4)]
    client.post(f"/v1/sessions/{sid}/messages", json={"user_id": user, "messages": turns}).raise_for_status()
    wait_memorized(client, sid, len(turns))

    # Ingress -> Memorizer: the compaction runs in the Memorizer, under the request's trace.
    trace_id, caller, headers = _traceparent()
    client.post(f"/v1/sessions/{sid}/compress", headers=headers).raise_for_status()
    # Each process exports its spans in batches of its own: wait for both sides of the call.
    sides = {"POST /v1/sessions/{session_id}/compress", "memory.compress", "Memorizer.compress"}
    trace = _of_trace(trace_id)(
        _wait_spans(spans_dir, lambda spans: sides <= {s["name"] for s in _of_trace(trace_id)(spans)})
    )
    by_id = _one_tree(trace, caller)
    (callee,) = [s for s in trace if s["name"] == "Memorizer.compress"]
    parent = by_id[callee["parent_span_id"]]
    assert _deployment(callee) == "Memorizer" and _deployment(parent) == "Ingress" and callee["parent_remote"]
    assert parent["name"] == "memory.compress"
    assert any(_deployment(s) == "Memorizer" and "db.system" in s["attributes"] for s in trace)

    # Memorizer -> Embedder: the pass that embedded the session's turns.
    def embedded(spans: list[dict]) -> list[dict]:
        runs = [
            s
            for s in spans
            if s["name"] == "memory.memorize" and s["attributes"]["memory.session"] == sid and s["attributes"]["memory.embedded"]
        ]
        return [s for s in spans if runs and s["trace_id"] == runs[0]["trace_id"]]

    trace = embedded(_wait_spans(spans_dir, lambda spans: any(s["name"] == "Embedder.embed_many" for s in embedded(spans))))
    (run,) = [s for s in trace if s["name"] == "memory.memorize"]
    assert run["parent_span_id"] is None and _deployment(run) == "Memorizer"  # a pass is a trace of its own
    by_id = _one_tree(trace, caller_span=None)
    (embed,) = [s for s in trace if s["name"] == "Embedder.embed_many"]
    assert _deployment(embed) == "Embedder" and embed["parent_remote"] and by_id[embed["parent_span_id"]] is run
