"""services/context.py on the real stores: the prompt for the next call fits its budget and holds the
system prompt, the user's facts, the memory recalled for the query and the newest turns, the
oldest left out first; a session is read only for its own user."""

from __future__ import annotations

import pytest

from serve_app.core.tokenizer import count_chat
from serve_app.errors import SessionOwnerError
from serve_app.schemas import AppendRequest, ContextRequestIn, FactIn, MemoryIn, MessageIn
from serve_app.services.context import build_working_memory
from serve_app.services.memories import add_memory
from serve_app.services.sessions import append_messages
from serve_app.services.users import put_fact
from tests.services.seed import new_id

SYSTEM = "You are the household's assistant."
BUDGET = 1024


async def test_the_prompt_within_budget_holds_the_recalled_memory_the_facts_and_the_newest_turns(deps, caller):
    tenant, user, session = caller.tenant, new_id("user"), new_id("session")
    allergy = await add_memory(deps, tenant, user, MemoryIn(text="My dog Rex is allergic to chicken."))
    await add_memory(deps, tenant, user, MemoryIn(text="The boiler was serviced in October."))
    await put_fact(deps, tenant, user, "city", FactIn(value="Lisbon", category="fact"))
    said = [
        MessageIn(role="user" if i % 2 == 0 else "assistant", content=f"Turn {i}: " + "we talked about the garden plans. " * 6)
        for i in range(60)
    ]  # about 3,000 tokens: more than the budget's history can hold
    await append_messages(deps, caller, session, AppendRequest(user_id=user, messages=said))

    request = ContextRequestIn(
        user_id=user, session_id=session, query="What food is the dog allergic to?", system_prompt=SYSTEM, max_tokens=BUDGET
    )
    built = await build_working_memory(deps, tenant, request)

    usage = built.usage
    assert usage.total_tokens == count_chat(built.messages, add_generation_prompt=True)
    assert usage.total_tokens <= usage.limit == BUDGET - usage.reserve_output
    system = built.messages[0]
    assert system["role"] == "system" and system["content"].startswith(SYSTEM)
    assert allergy.id in [hit.id for hit in built.recalled] and "My dog Rex is allergic to chicken." in system["content"]
    assert "city (fact): Lisbon" in system["content"] and [f.key for f in built.facts] == ["city"]
    # The newest turns, in order and whole, the oldest left out.
    assert built.messages[-1]["content"] == said[-1].content
    kept = built.included_seqs
    assert kept == list(range(61 - len(kept), 61)) and 0 < len(kept) < 60 and usage.omitted_turns == 60 - len(kept)
    assert [m["content"] for m in built.messages[1:]] == [t.content for t in said[-len(kept) :]]
    assert built.degraded == []

    with pytest.raises(SessionOwnerError):
        await build_working_memory(deps, tenant, ContextRequestIn(user_id=new_id("intruder"), session_id=session))


async def test_a_chat_call_sees_its_own_turns_after_the_log_it_was_planned_on(deps, caller):
    tenant, user, session = caller.tenant, new_id("user"), new_id("session")
    opening = [MessageIn(role="user", content="first"), MessageIn(role="assistant", content="one")]
    await append_messages(deps, caller, session, AppendRequest(user_id=user, messages=opening))
    # Another call appended meanwhile: a prompt planned on two turns leaves it out.
    await append_messages(deps, caller, session, AppendRequest(user_id=user, messages=[MessageIn(role="user", content="other")]))
    built = await build_working_memory(
        deps,
        tenant,
        ContextRequestIn(user_id=user, session_id=session, max_tokens=BUDGET),
        pending_turns=[{"role": "user", "content": "mine"}],
        history_upto=2,
    )
    assert [m["content"] for m in built.messages[1:]] == ["first", "one", "mine"] and built.included_seqs == [1, 2]
