"""The OpenAI-compatible chat path the way agents call it, in process on the real stores, its model a
scripted upstream (TEST DOUBLE; tests/llm runs the same path on vLLM with a tiny Qwen2): each turn
stored as often as it was said, retries told by the client, every input a 4xx or an answer, never a
500, and the upstream model spent only within the tenant's budget."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from serve_app.core.auth import hash_key
from tests.contract.chat_app import chat_app

URL = "/v1/chat/completions"
KEY, KEY_PAIR = "key-chat-limited-" + uuid.uuid4().hex, "key-chat-pair-" + uuid.uuid4().hex


@pytest.fixture
async def app(backends, embed, upstream):
    upstream.failures.clear()
    upstream.reply = None
    async with chat_app(backends, embed, upstream) as (client, deps):
        yield client


def ids() -> tuple[str, str]:
    return "u-" + uuid.uuid4().hex[:8], "s-" + uuid.uuid4().hex[:8]


def user(text: str) -> dict:
    return {"role": "user", "content": text}


async def log_of(client, session: str) -> list[dict]:
    page = await client.get(f"/v1/sessions/{session}/messages", params={"limit": 1000})
    assert page.status_code == 200, page.text
    return page.json()["messages"]


async def ask(client, messages, *, who: str, session: str | None = None, headers: dict | None = None, **more):
    sent = {"X-Session-Id": session} if session else {}
    body = {"model": "m", "messages": messages, "user": who, **more}
    return await client.post(URL, json=body, headers=sent | (headers or {}))


def sse(text: str) -> list[dict]:
    events = [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", text[-500:]
    return [json.loads(e) for e in events[:-1]]


async def test_the_same_words_sent_again_as_a_new_turn_are_stored_again(app, upstream):
    who, session = ids()
    for text in ("Write a plan", "continue", "continue"):
        answered = await ask(app, [user(text)], who=who, session=session)
        assert answered.status_code == 200, answered.text
        assert upstream.requests[-1]["messages"][-1] == user(text)  # the prompt ends with the new turn
    log = await log_of(app, session)
    assert [m["content"] for m in log if m["role"] == "user"] == ["Write a plan", "continue", "continue"]
    assert [m["role"] for m in log] == ["user", "assistant"] * 3


async def test_two_conversations_that_open_alike_without_a_session_id_never_share_a_log(app):
    who, _ = ids()
    first = (await ask(app, [user("Hi")], who=who)).json()
    second = (await ask(app, [user("Hi")], who=who)).json()
    assert first["memory"]["session_id"] != second["memory"]["session_id"]
    # Each continues its own log when it resends its history.
    for opened in (first, second):
        history = [user("Hi"), {"role": "assistant", "content": opened["choices"][0]["message"]["content"]}]
        more = (await ask(app, [*history, user("And then?")], who=who)).json()
        assert more["memory"]["session_id"] == opened["memory"]["session_id"]
        assert more["memory"]["alignment"] == "continues"
        log = await log_of(app, opened["memory"]["session_id"])
        assert [m["content"] for m in log][:2] == [m["content"] for m in history] and len(log) == 4


async def test_two_calls_at_once_in_one_session_both_keep_their_answers(app):
    who, session = ids()
    answers = await asyncio.gather(*(ask(app, [user(f"question {i}")], who=who, session=session) for i in range(2)))
    log = await log_of(app, session)
    stored = [m["content"] for m in log if m["role"] == "assistant"]
    for answered in answers:
        assert answered.status_code == 200, answered.text
        assert answered.json()["choices"][0]["message"]["content"] in stored
    assert len(stored) == 2 and len(log) == 4


async def test_a_retry_marked_by_the_sdk_gets_the_stored_answer_without_calling_the_model(app, upstream):
    who, session = ids()
    body = [user("What is ORD-4411's status?")]
    first = await ask(app, body, who=who, session=session, headers={"x-stainless-retry-count": "0"})
    calls = len(upstream.requests)
    retried = await ask(app, body, who=who, session=session, headers={"x-stainless-retry-count": "1"})
    assert retried.status_code == 200, retried.text
    assert retried.json()["choices"][0]["message"] == first.json()["choices"][0]["message"]
    assert len(upstream.requests) == calls  # the model was not asked again
    assert retried.json()["memory"]["stored_seqs"] == first.json()["memory"]["stored_seqs"]
    streamed = await ask(app, body, who=who, session=session, headers={"x-stainless-retry-count": "2"}, stream=True)
    chunks = sse(streamed.text)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == first.json()["choices"][0]["message"]["content"] and chunks[-1]["memory"]["stored_seqs"] == [1, 2]
    assert len(await log_of(app, session)) == 2 and len(upstream.requests) == calls
    # Not marked as a retry: the same words are a new turn.
    again = await ask(app, body, who=who, session=session, headers={"x-stainless-retry-count": "0"})
    assert again.json()["memory"]["stored_seqs"] == [3, 4]


async def test_an_idempotency_key_names_one_call_and_refuses_another_body(app, upstream):
    who, session = ids()
    key = {"Idempotency-Key": uuid.uuid4().hex}
    first = await ask(app, [user("Book the 9:40 train.")], who=who, session=session, headers=key)
    again = await ask(app, [user("Book the 9:40 train.")], who=who, session=session, headers=key)
    assert again.json()["choices"][0]["message"] == first.json()["choices"][0]["message"]
    other = await ask(app, [user("Book the 10:40 train.")], who=who, session=session, headers=key)
    assert other.status_code == 422 and other.json()["error"]["param"] == "Idempotency-Key", other.text
    assert len(await log_of(app, session)) == 2


async def test_a_retry_whose_answer_was_lost_stores_each_turn_once(app, upstream):
    who, session = ids()
    upstream.failures.append((500, "engine crashed", {}))
    failed = await ask(app, [user("Draft the memo")], who=who, session=session, headers={"x-stainless-retry-count": "0"})
    assert failed.status_code == 502, failed.text
    retried = await ask(app, [user("Draft the memo")], who=who, session=session, headers={"x-stainless-retry-count": "1"})
    assert retried.status_code == 200, retried.text
    assert [m["role"] for m in await log_of(app, session)] == ["user", "assistant"]


async def test_inputs_that_were_500s_are_answered_or_refused_in_openais_shape(app):
    who, session = ids()
    document = "A pasted document. " * 600  # over 8,192 characters
    long = await ask(app, [user(document)], who=who, session=session)
    assert long.status_code == 200, long.text
    assert (await log_of(app, session))[0]["content"] == document  # stored whole
    for body in (
        {"messages": [user("hi")], "max_tokens": 2_000_000},
        {"messages": [{"role": "system", "content": "s" * 70_000}, user("hi")], "store": False},
        {"messages": [user("nul \x00 inside")], "store": False},
        {"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "function": "x"}]}, user("hi")]},
    ):
        answered = await app.post(URL, json={"model": "m", "user": who, **body})
        assert answered.status_code < 500, (body, answered.text)
        if answered.status_code != 200:
            assert answered.json()["error"]["type"] == "invalid_request_error", answered.text


async def test_a_newest_turn_past_the_window_is_context_length_exceeded_and_stores_nothing(app, upstream):
    who, session = ids()
    upstream_window = upstream.window
    huge = " ".join(f"word{i}" for i in range(upstream_window))  # more tokens than the window
    refused = await ask(app, [user(huge[:60_000])], who=who, session=session, max_tokens=30_000)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "context_length_exceeded"
    assert (await app.get(f"/v1/sessions/{session}")).status_code == 404


async def test_a_long_answer_is_stored_whole_streamed_or_not(app, upstream):
    who, session = ids()
    upstream.reply = lambda body: "long answer. " * 5500  # about 70 KB
    plain = await ask(app, [user("Write it all out.")], who=who, session=session, max_tokens=20_000)
    assert plain.status_code == 200, plain.text
    streamed = await ask(app, [user("Once more.")], who=who, session=session, max_tokens=20_000, stream=True)
    chunks = sse(streamed.text)
    assert chunks[-1]["memory"]["stored_seqs"] == [3, 4]
    log = await log_of(app, session)
    assert [len(m["content"]) for m in log if m["role"] == "assistant"] == [len("long answer. " * 5500)] * 2


async def test_the_rate_limit_is_spent_before_the_model_is_called(backends, embed, upstream):
    upstream.failures.clear()
    upstream.reply = None
    key = {"Authorization": f"Bearer {KEY}"}
    keys = {"api_keys": {hash_key(KEY): "chat-limited"}, "rate_limit_overrides": {"chat-limited": 3}}
    async with chat_app(backends, embed, upstream, **keys) as (client, _):
        client.headers.update(key)
        who, session = ids()
        before = len(upstream.requests)
        statuses = [(await ask(client, [user(f"q{i}")], who=who, store=False)).status_code for i in range(6)]
        assert statuses.count(200) <= 3 and 429 in statuses, statuses
        assert len(upstream.requests) - before == statuses.count(200)
        refused = await ask(client, [user("q")], who=who, store=False)
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    keys = {"api_keys": {hash_key(KEY_PAIR): "chat-pair"}, "rate_limit_overrides": {"chat-pair": 2}}
    async with chat_app(backends, embed, upstream, **keys) as (client, _):
        client.headers.update({"Authorization": f"Bearer {KEY_PAIR}"})
        stored = await ask(client, [user("one turn, one answer")], who=who, session=session)
        assert stored.status_code == 200, stored.text  # the answer's append is not refused after the fact
        assert len(await log_of(client, session)) == 2


async def test_upstream_failures_are_the_services_and_never_show_its_key(app, upstream):
    who, _ = ids()
    upstream.failures.append((401, "Incorrect API key provided: sk-upst***cdef", {}))
    denied = await ask(app, [user("hi")], who=who, store=False)
    assert denied.status_code == 502, denied.text
    assert "sk-" not in denied.text and denied.json()["error"]["type"] != "authentication_error"
    upstream.failures.append((429, "slow down", {"Retry-After": "7"}))
    busy = await ask(app, [user("hi")], who=who, store=False)
    assert busy.status_code == 503 and busy.headers["Retry-After"] == "7", busy.text


async def test_a_gateway_can_make_the_user_header_win(backends, embed, upstream):
    upstream.failures.clear()
    async with chat_app(backends, embed, upstream, chat_user_header_wins=True) as (client, _):
        answered = await client.post(
            URL, json={"model": "m", "messages": [user("hi")], "user": "mallory", "store": False}, headers={"X-User-Id": "alice"}
        )
        assert answered.json()["memory"]["user_id"] == "alice"
    async with chat_app(backends, embed, upstream) as (client, _):
        answered = await client.post(
            URL, json={"model": "m", "messages": [user("hi")], "user": "bob", "store": False}, headers={"X-User-Id": "alice"}
        )
        assert answered.json()["memory"]["user_id"] == "bob"  # the default: the body's user, as OpenAI's field


async def test_a_lone_surrogate_the_model_cannot_be_sent_is_a_422_stored_or_not(app, upstream):
    who, _ = ids()
    for store in (False, True):
        raw = json.dumps({"model": "m", "messages": [user("half a pair: \ud800")], "user": who, "store": store})
        refused = await app.post(URL, content=raw, headers={"content-type": "application/json"})
        assert refused.status_code == 422 and "surrogate" in refused.json()["error"]["message"], refused.text


async def test_a_chat_call_reads_and_writes_the_memory_spaces_it_names(app, upstream):
    who, session = ids()
    space = "team-" + uuid.uuid4().hex[:8]
    (await app.post("/v1/spaces", json={"space_id": space})).raise_for_status()
    fact = {"text": "The team's staging database is pg-stage-9 in eu-west-3."}
    (await app.post(f"/v1/spaces/{space}/memories", json=fact)).raise_for_status()

    question = [user("Which staging database do we use?")]
    asked = await ask(app, question, who=who, headers={"X-Memory-Spaces": space}, store=False)
    assert asked.status_code == 200, asked.text
    prompt = upstream.requests[-1]["messages"][0]["content"]
    assert "pg-stage-9" in prompt and f"space {space}" in prompt
    await ask(app, question, who=who, store=False)
    assert "pg-stage-9" not in upstream.requests[-1]["messages"][0]["content"]  # not named: not read

    moved = [user("We moved staging to pg-stage-10.")]
    written = await ask(app, moved, who=who, session=session, metadata={"memory_space": space})
    assert written.status_code == 200, written.text
    assert {m.get("space") for m in await log_of(app, session)} == {space}

    absent = await ask(app, [user("hi")], who=who, headers={"X-Memory-Spaces": f"{space},no-such-space"}, store=False)
    assert absent.status_code == 404 and "no-such-space" in absent.text
    malformed = await ask(app, [user("hi")], who=who, metadata={"memory_spaces": "bad space"}, store=False)
    assert malformed.status_code == 422 and "memory_spaces" in malformed.text
