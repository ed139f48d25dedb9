"""The chat body fuzzed with a model configured (the suite's Schemathesis run meets a service without
one, which refuses before any of this): whatever an agent or a broken client sends, the answer is a
200 or a 4xx in OpenAI's error shape, never a 500. In process on the real stores; the model is a
scripted upstream (TEST DOUBLE; tests/llm runs the real one)."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.contract.chat_app import chat_app
from tests.doubles import ScriptedUpstream

EXAMPLES = int(os.environ.get("MEMSERVE_CHAT_FUZZ_EXAMPLES", "120"))

texts = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", "\x00", "a\x00b", "\ud800", "x" * 9000, "word " * 3000, "🙂" * 50]),
)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63), st.floats(allow_nan=False), texts)
junk = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6
)
functions = st.one_of(
    junk,
    st.fixed_dictionaries({"name": texts}, optional={"arguments": st.one_of(texts, junk)}),
)
tool_calls = st.lists(
    st.one_of(junk, st.fixed_dictionaries({"function": functions}, optional={"id": st.one_of(texts, junk), "type": texts})),
    max_size=3,
)
parts = st.lists(
    st.one_of(junk, st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "x"]), "text": texts})), max_size=3
)
messages = st.lists(
    st.one_of(
        junk,
        st.fixed_dictionaries(
            {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", ""])},
            optional={
                "content": st.one_of(texts, st.none(), parts, junk),
                "name": st.one_of(texts, junk),
                "tool_calls": st.one_of(tool_calls, junk),
                "tool_call_id": st.one_of(texts, junk),
            },
        ),
    ),
    max_size=5,
)
# Mostly well-formed conversations, so the fuzz reaches past validation into planning, the budget,
# the stores and the model call; the rest is anything at all.
plain = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "user"]), "content": texts}),
    min_size=1,
    max_size=4,
).map(lambda turns: [*turns, {"role": "user", "content": "and?"}])
sizes = st.one_of(st.sampled_from([1, 16, 4000, 4095, 4096, 70_000, 1_048_577, 2_000_000]), st.integers(-5, 3_000_000), junk)
bodies = st.fixed_dictionaries(
    {"model": st.one_of(st.just("m"), texts, junk), "messages": st.one_of(plain, plain, messages, junk)},
    optional={
        "max_tokens": sizes,
        "max_completion_tokens": sizes,
        "stream": st.one_of(st.booleans(), junk),
        "store": st.one_of(st.booleans(), st.none(), junk),
        "user": st.one_of(texts, junk),
        "metadata": st.one_of(st.dictionaries(st.sampled_from(["session_id", "x"]), texts, max_size=2), junk),
        "n": st.one_of(st.integers(-1, 3), junk),
        "tools": st.one_of(st.lists(junk, max_size=2), junk),
        "temperature": junk,
    },
)
headers = st.fixed_dictionaries(
    {},
    optional={
        "Idempotency-Key": st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=300),
        "x-stainless-retry-count": st.sampled_from(["0", "1", "7", "", "x"]),
        "X-Session-Id": st.sampled_from(["s-fuzz", "bad id!", "s" * 200]),
        "X-User-Id": st.sampled_from(["u-fuzz", "", "bad user!"]),
    },
)


@pytest.fixture(scope="module")
def upstream():
    started = ScriptedUpstream(window=4096).start()
    yield started
    started.stop()


def test_no_chat_body_is_a_500(backends, embed, upstream):
    loop = asyncio.new_event_loop()
    app = chat_app(backends, embed, upstream)
    client, _ = loop.run_until_complete(app.__aenter__())

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=bodies, sent=headers)
    def post(body, sent):
        # As a client's JSON encoder may write it: lone surrogates escaped, NaN and Infinity bare.
        raw = json.dumps(body).encode()
        sent = sent | {"content-type": "application/json"}
        response = loop.run_until_complete(client.post("/v1/chat/completions", content=raw, headers=sent))
        assert response.status_code < 500, (body, sent, response.text[:500])
        if response.status_code >= 400:
            error = response.json()["error"]
            assert error["message"] and error["type"], response.text

    try:
        post()
    finally:
        loop.run_until_complete(app.__aexit__(None, None, None))
        loop.close()
