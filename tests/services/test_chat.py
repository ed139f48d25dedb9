"""services/chat.py on the real stores, its model a `ScriptedUpstream` (a TEST DOUBLE of the GPU
model; tests/llm runs the path on vLLM): a call answers from working memory with a `Completion`
or a `CompletionStream`, stores its turn and the answer whole, and a retry of an answered call is
the stored answer, the model not asked again. The HTTP framing is tests/contract/test_chat_path.py's."""

from __future__ import annotations

import json

import pytest

from serve_app.chat_schemas import ChatCompletionRequest
from serve_app.schemas import MemoryIn
from serve_app.services.chat import DONE, Completion, CompletionStream, chat_completion
from serve_app.services.memories import add_memory
from tests.services.seed import new_id


@pytest.fixture
async def chat_deps(make_deps, upstream):
    upstream.reply = None
    upstream.failures.clear()
    deps = make_deps(
        llm_mode="openai", llm_base_url=upstream.base_url, llm_model=upstream.model, llm_api_key="sk-test-0123456789"
    )
    yield deps
    await deps.llm.close()


def ask(user: str, text: str, **more) -> ChatCompletionRequest:
    return ChatCompletionRequest(
        model="m", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}], user=user, **more
    )


async def events_of(stream: CompletionStream) -> tuple[list[dict], str]:
    """The stream's JSON events, and the data of its last event."""
    data = [event async for event in stream.events]
    return [json.loads(d) for d in data[:-1]], data[-1]


async def stored(deps, tenant: str, session: str) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in await deps.stores.log.read(tenant, session)]


async def test_a_completion_answers_from_memory_and_stores_the_turn_and_the_answer(chat_deps, caller, upstream):
    user, session = new_id("user"), new_id("session")
    note = await add_memory(chat_deps, caller.tenant, user, MemoryIn(text="The wifi password is taped under the router."))
    upstream.reply = lambda body: "Under the router."

    reply = await chat_completion(chat_deps, caller, ask(user, "Where is the wifi password?"), {"x-session-id": session})

    assert isinstance(reply, Completion)
    assert reply.body["choices"][0]["message"] == {"role": "assistant", "content": "Under the router."}
    memory = reply.body["memory"]
    assert (memory["session_id"], memory["user_id"], memory["stored_seqs"], memory["alignment"]) == (session, user, [1, 2], "new")
    assert memory["recalled"] == [note.id]
    assert reply.memory_headers == {"X-Memory-Session-Id": session, "X-Memory-Recalled": note.id, "X-Memory-Stored-Seqs": "1,2"}
    sent = upstream.requests[-1]["messages"]
    assert sent[0]["role"] == "system" and sent[0]["content"].startswith("Be brief.")
    assert "The wifi password is taped under the router." in sent[0]["content"]
    assert sent[-1] == {"role": "user", "content": "Where is the wifi password?"}
    assert await stored(chat_deps, caller.tenant, session) == [
        ("user", "Where is the wifi password?"),
        ("assistant", "Under the router."),
    ]


async def test_a_stream_gives_the_models_chunks_then_the_report_of_the_stored_answer_then_done(chat_deps, caller, upstream):
    user, session = new_id("user"), new_id("session")
    upstream.reply = lambda body: "Rex eats fish, never chicken."

    reply = await chat_completion(chat_deps, caller, ask(user, "What does Rex eat?", stream=True), {"x-session-id": session})

    assert isinstance(reply, CompletionStream)
    assert reply.memory_headers["X-Memory-Stored-Seqs"] == "1"  # the answer is not stored yet when the stream starts
    events, last = await events_of(reply)
    assert last == DONE
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in events if c["choices"])
    assert text == "Rex eats fish, never chicken."
    assert events[-1]["choices"] == [] and events[-1]["memory"]["stored_seqs"] == [1, 2]
    assert await stored(chat_deps, caller.tenant, session) == [("user", "What does Rex eat?"), ("assistant", text)]


async def test_a_retry_of_an_answered_call_is_the_stored_answer_and_the_model_is_not_asked(chat_deps, caller, upstream):
    user, session = new_id("user"), new_id("session")
    first = await chat_completion(
        chat_deps, caller, ask(user, "Book the 9:40 train."), {"x-session-id": session, "x-stainless-retry-count": "0"}
    )
    asked = len(upstream.requests)
    retried = await chat_completion(
        chat_deps,
        caller,
        ask(user, "Book the 9:40 train.", stream=True),
        {"x-session-id": session, "x-stainless-retry-count": "1"},
    )
    assert len(upstream.requests) == asked
    assert isinstance(retried, CompletionStream) and retried.memory_headers["X-Memory-Stored-Seqs"] == "1,2"
    events, last = await events_of(retried)
    assert last == DONE and events[0]["choices"][0]["delta"] == first.body["choices"][0]["message"]
    assert events[-1]["memory"]["alignment"] == "retried" and events[-1]["memory"]["stored_seqs"] == [1, 2]
    assert len(await stored(chat_deps, caller.tenant, session)) == 2


async def test_a_call_with_store_false_is_answered_and_stores_nothing(chat_deps, caller, upstream):
    user, session = new_id("user"), new_id("session")
    reply = await chat_completion(chat_deps, caller, ask(user, "Just between us.", store=False), {"x-session-id": session})
    assert isinstance(reply, Completion) and reply.body["choices"][0]["message"]["content"].startswith("answer-")
    assert reply.body["memory"]["stored_seqs"] == [] and reply.memory_headers["X-Memory-Stored-Seqs"] == ""
    assert await chat_deps.stores.log.meta(caller.tenant, session) is None
