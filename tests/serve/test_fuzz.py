"""Schemathesis against the running service's own /openapi.json: no 5xx at all, and every 4xx says why.

The fuzzer calls every operation with schema-conforming and schema-violating data (capped, derandomized,
so CI sends the same requests every run) as tenant "fuzz", whose random writes and DELETEs cannot touch
the other tests' data. Hand-written hostile payloads follow: text that no store can keep (NUL, lone
surrogates), numbers no column holds, non-finite floats, timestamps outside the representable range,
bodies that are not JSON at all.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.config import HealthCheck

from .conftest import KEY_FUZZ, wait_memorized

AUTH = {"Authorization": f"Bearer {KEY_FUZZ}"}
# A user archive (POST /v1/users/{uid}/import) is JSON Lines: sent as the text the fuzzer makes.
schemathesis.serializer.alias("application/x-ndjson", "text/plain")
MAX_EXAMPLES = 25  # per operation and run; coverage-phase boundary cases come on top


@pytest.fixture(scope="session")
def fuzz_schema(service_url):
    schema = schemathesis.openapi.from_url(f"{service_url}/openapi.json", timeout=30)
    schema.config.update(
        base_url=service_url,
        headers=AUTH,
        request_timeout=60,
        suppress_health_check=[HealthCheck.all],
    )
    schema.config.generation.update(
        modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
        max_examples=MAX_EXAMPLES,
        deterministic=True,  # Hypothesis' derandomize: the same cases every run, locally and in CI
        no_shrink=True,  # a failure already prints its request as a curl command; shrinking costs requests
        database="none",
        with_security_parameters=False,  # the bearer key above, not random credentials
    )
    schema.config.phases.update(phases=["examples", "coverage", "fuzzing"])
    return schema


schema = schemathesis.pytest.from_fixture("fuzz_schema")


@pytest.fixture(autouse=True)
def _node_id_for_schemathesis(request):
    """Schemathesis 4.32 reads `item._nodeid`, which pytest 9.2 no longer sets (it keeps `_id`)."""
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


OPENAI_SHAPED = ("/v1/chat/", "/v1/models")  # OpenAI's `{"error": {"message": ...}}`, which its SDK parses


def _refusal_message(path: str, body: Any) -> Any:
    """The message a refusal carries: `detail` in API v1, `error.message` on the OpenAI-compatible paths."""
    if not isinstance(body, dict):
        return None
    if path.startswith(OPENAI_SHAPED):
        error = body.get("error")
        return error.get("message") if isinstance(error, dict) else None
    return body.get("detail")


def four_xx_has_a_message(ctx, response, case) -> bool | None:
    """A refusal is JSON with a non-empty message in the path's error shape, so the client can tell
    what to change."""
    if 400 <= response.status_code < 500:
        try:
            body = response.json()
        except ValueError as exc:
            raise AssertionError(f"{response.status_code} body is not JSON: {response.text[:200]!r}") from exc
        if not _refusal_message(case.path, body):
            raise AssertionError(f"{response.status_code} without a message for {case.path}: {response.text[:200]!r}")
    return None


@schema.parametrize()
def test_no_5xx_and_every_4xx_explains(case):
    case.call_and_validate(checks=[not_a_server_error, four_xx_has_a_message])


# --- Hand-written hostile payloads -------------------------------------------------------------------

NUL, SURROGATE = "a\x00b", "a\ud800b"
DEEP = 20_000  # past the JSON parser's recursion limit
HUGE = 10**30
LIVE = "fz-live"  # a session that exists, so reads with hostile parameters reach the store


def _json(body: Any) -> bytes:
    """JSON text as a client could send it: lone surrogates as \\ud800 escapes, NaN/Infinity as bare words."""
    return json.dumps(body, ensure_ascii=True, allow_nan=True).encode("ascii")


def _message(**fields: Any) -> dict:
    return {"user_id": "fuzz-user", "messages": [{"role": "user", "content": "x", **fields}]}


def _text_cases(bad: str) -> list[tuple[str, str, Any]]:
    """Every free-text field of the API, one request each, holding `bad`."""
    return [
        ("POST", "/v1/sessions/fz-text/messages", _message(content=bad)),
        ("POST", "/v1/sessions/fz-text/messages", _message(name=bad)),
        ("POST", "/v1/sessions/fz-text/messages", _message(role="tool", tool_call_id=bad)),
        (
            "POST",
            "/v1/sessions/fz-text/messages",
            _message(role="assistant", tool_calls=[{"id": bad, "function": {"name": "f", "arguments": "{}"}}]),
        ),
        (
            "POST",
            "/v1/sessions/fz-text/messages",
            _message(role="assistant", tool_calls=[{"function": {"name": bad, "arguments": "{}"}}]),
        ),
        (
            "POST",
            "/v1/sessions/fz-text/messages",
            _message(role="assistant", tool_calls=[{"function": {"name": "f", "arguments": bad}}]),
        ),
        (
            "POST",
            "/v1/sessions/fz-text/messages",
            _message(role="assistant", tool_calls=[{"function": {"name": "f", "arguments": {bad: bad}}}]),
        ),
        ("POST", "/v1/context", {"user_id": "fuzz-user", "session_id": "fz-text", "query": bad}),
        ("POST", "/v1/context", {"user_id": "fuzz-user", "session_id": "fz-text", "system_prompt": bad}),
        (
            "POST",
            "/v1/context",
            {"user_id": "fuzz-user", "session_id": "fz-text", "tool_results": [{"name": bad, "content": "x"}]},
        ),
        (
            "POST",
            "/v1/context",
            {"user_id": "fuzz-user", "session_id": "fz-text", "tool_results": [{"name": "t", "content": bad}]},
        ),
        ("PUT", "/v1/users/fuzz-user/facts/k", {"value": bad}),
        ("POST", "/v1/users/fuzz-user/memories", {"text": bad}),
        ("POST", "/v1/users/fuzz-user/memories/search", {"query": bad}),
    ]


HOSTILE: list[tuple[str, str, Any]] = [
    *_text_cases(NUL),
    *_text_cases(SURROGATE),
    # numbers no column holds, and floats that are not numbers
    ("PUT", "/v1/users/fuzz-user/facts/k", {"value": "v", "source_seqs": [HUGE]}),
    ("PUT", "/v1/users/fuzz-user/facts/k", {"value": "v", "source_seqs": [-HUGE]}),
    ("POST", "/v1/users/fuzz-user/memories/search", {"query": "q", "top_k": HUGE}),
    ("POST", "/v1/users/fuzz-user/memories/search", {"query": "q", "min_score": float("nan")}),
    ("POST", "/v1/users/fuzz-user/memories/search", {"query": "q", "min_score": float("inf")}),
    ("POST", "/v1/context", {"user_id": "u", "session_id": "fz-num", "max_tokens": HUGE}),
    ("POST", "/v1/context", {"user_id": "u", "session_id": "fz-num", "min_score": float("nan")}),
    ("POST", "/v1/context", {"user_id": "u", "session_id": "fz-num", "shares": {"system": float("nan")}}),
    ("POST", "/v1/context", {"user_id": "u", "session_id": "fz-num", "shares": {"memory": float("-inf")}}),
    (
        "POST",
        "/v1/sessions/fz-num/messages",
        _message(role="assistant", tool_calls=[{"function": {"name": "f", "arguments": {"x": float("nan")}}}]),
    ),
    ("GET", f"/v1/sessions/{LIVE}/messages?after={HUGE}", None),
    ("GET", f"/v1/sessions/{LIVE}/messages?limit={HUGE}", None),
    ("GET", f"/v1/users/fuzz-user/memories?offset={HUGE}", None),
    # timestamps: naive, far past/future, and ones whose UTC instant leaves datetime's range
    ("POST", "/v1/users/fuzz-user/memories", {"text": "t", "created_at": "0001-01-01T00:00:00+14:00"}),
    ("POST", "/v1/users/fuzz-user/memories", {"text": "t", "created_at": "9999-12-31T23:59:59-14:00"}),
    ("POST", "/v1/sessions/fz-time/messages", _message(created_at="0001-01-01T00:00:00+14:00")),
    ("POST", "/v1/sessions/fz-time/messages", _message(created_at="9999-12-31T23:59:59-14:00")),
    ("POST", "/v1/sessions/fz-time/messages", _message(created_at="not a date")),
    # ids: NUL, surrogate, and pattern breakers in paths and bodies
    ("POST", "/v1/sessions/fz%00id/messages", _message()),
    ("GET", "/v1/users/fuzz%00user/facts", None),
    ("DELETE", "/v1/users/fuzz-user/memories/m%ED%A0%80", None),
    ("POST", "/v1/sessions/fz-id/messages", _message(id=NUL)),
    ("POST", "/v1/sessions/fz-id/messages", {"user_id": SURROGATE, "messages": [{"role": "user"}]}),
    ("PUT", "/v1/users/fuzz-user/facts/k", {"value": "v", "source_session": SURROGATE}),
    # bodies that are not the JSON the operation wants
    ("POST", "/v1/sessions/fz-body/messages", b"{not json"),
    ("POST", "/v1/sessions/fz-body/messages", b"\xff\xfe\x00garbage"),
    ("POST", "/v1/sessions/fz-body/messages", b""),
    ("POST", "/v1/sessions/fz-body/messages", b"[]"),
    ("POST", "/v1/sessions/fz-body/messages", b"null"),
    ("POST", "/v1/sessions/fz-body/messages", b'"a string"'),
    ("POST", "/v1/sessions/fz-body/messages", b"[" * DEEP + b"]" * DEEP),
    ("POST", "/v1/sessions/fz-body/messages", b'{"user_id": "u", "messages": ' + b"[" * DEEP + b"]" * DEEP + b"}"),
]


@pytest.fixture(scope="module")
def fuzz_http(service_url):
    with httpx.Client(base_url=service_url, timeout=60, headers=AUTH) as http:
        http.post(f"/v1/sessions/{LIVE}/messages", json=_message()).raise_for_status()
        yield http


def _case_id(case: Any) -> str:
    method, path, _ = case.values if hasattr(case, "values") else case
    return f"{method} {path[:48]}"


@pytest.mark.parametrize("method,path,body", HOSTILE, ids=[f"{i:02d}-{_case_id(c)}" for i, c in enumerate(HOSTILE)])
def test_hostile_payloads_get_a_clear_4xx(fuzz_http, method, path, body):
    content = body if isinstance(body, bytes) or body is None else _json(body)
    r = fuzz_http.request(method, path, content=content, headers={"Content-Type": "application/json"})
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:500])
    assert r.json()["detail"], r.text


def test_after_the_hostile_payloads_reads_and_memorization_still_work(fuzz_http):
    """Nothing unreadable got in: listing and the memorizer still get through everything stored."""
    for path in ("/v1/users/fuzz-user/memories", "/v1/users/fuzz-user/facts", f"/v1/sessions/{LIVE}/messages"):
        r = fuzz_http.get(path)
        assert r.status_code == 200, (path, r.status_code, r.text[:500])
    fuzz_http.post(f"/v1/sessions/{LIVE}/messages", json=_message(content="after the storm")).raise_for_status()
    assert wait_memorized(fuzz_http, LIVE, 2)["memorized_upto_seq"] == 2
