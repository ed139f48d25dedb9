"""services/inspection.py on the real stores: what the inspector shows of a tenant (its users with
their counts, page by page; its live figures) and a session exported whole, with only its user's
memories of it."""

from __future__ import annotations

import pytest

from serve_app.errors import SessionNotFound
from serve_app.schemas import AppendRequest, FactIn, MemoryIn, MessageIn
from serve_app.services.inspection import export_session, list_users, stats
from serve_app.services.memories import add_memory
from serve_app.services.sessions import append_messages
from serve_app.services.users import put_fact
from tests.services.seed import memorized_turns, new_id


async def test_users_are_listed_by_id_with_their_memories_and_facts_and_the_figures_count_them(deps, caller):
    tenant, ann, bob, cat = caller.tenant, new_id("ann"), new_id("bob"), new_id("cat")
    for text in ("Ann runs on Sundays.", "Ann is learning Dutch."):
        await add_memory(deps, tenant, ann, MemoryIn(text=text))
    await put_fact(deps, tenant, ann, "language", FactIn(value="Dutch"))
    await put_fact(deps, tenant, bob, "city", FactIn(value="Ghent"))
    await put_fact(deps, tenant, bob, "city", FactIn(value="Bruges"))  # supersedes: one current fact
    # Cat's turns are not memorized yet: she is not a user to list, and her session waits.
    await append_messages(
        deps, caller, new_id("session"), AppendRequest(user_id=cat, messages=[MessageIn(role="user", content="hi")])
    )

    first = await list_users(deps, tenant, after="", limit=1)
    assert [(u.user_id, u.memories, u.facts) for u in first.users] == [(ann, 2, 1)] and first.next_after == ann
    rest = await list_users(deps, tenant, after=first.next_after, limit=1)
    assert [(u.user_id, u.memories, u.facts) for u in rest.users] == [(bob, 0, 1)]
    assert (await list_users(deps, tenant, after=bob, limit=1)).users == []

    figures = await stats(deps, tenant)
    assert figures.memories == 2 and figures.memorization.sessions_pending == 1
    assert figures.memorization.oldest_pending_s is not None and figures.memorization.oldest_pending_s >= 0
    assert figures.llm.mode == "none" and figures.recall.samples == 0


async def test_a_session_is_exported_whole_with_its_users_memories_of_it(deps, caller):
    tenant, user, session = caller.tenant, new_id("user"), new_id("session")
    said = ["The lease ends in May.", "The landlord is Mr. Costa."]
    await append_messages(
        deps, caller, session, AppendRequest(user_id=user, messages=[MessageIn(role="user", content=t) for t in said])
    )
    ids = await memorized_turns(deps, tenant, user, session, said)
    await memorized_turns(deps, tenant, new_id("other"), session, ["Another user's turn under the same id."])

    export = await export_session(deps, tenant, session)
    assert (export.session.session_id, export.session.user_id, export.session.message_count) == (session, user, 2)
    assert [(m.seq, m.content) for m in export.messages] == [(1, said[0]), (2, said[1])] and export.summary == ""
    assert [(m.id, m.text, m.seq, m.kind) for m in export.memories] == [
        (ids[0], said[0], 1, "turn"),
        (ids[1], said[1], 2, "turn"),
    ]
    with pytest.raises(SessionNotFound):
        await export_session(deps, tenant, new_id("session"))
