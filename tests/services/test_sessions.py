"""services/sessions.py on the real stores: an append stores each client id once and in order, a
session belongs to the user who opened it, and a delete takes the log with the memories made of it
(its owner's while the log lives, every user's once it is gone)."""

from __future__ import annotations

import pytest

from serve_app.errors import SessionNotFound, SessionOwnerError
from serve_app.schemas import AppendRequest, MemoryIn, MessageIn
from serve_app.services.memories import add_memory
from serve_app.services.sessions import append_messages, delete_session, describe_session, read_page, user_sessions
from tests.services.seed import memorized_turns, new_id


def turns(*pairs: tuple[str, str, str]) -> list[MessageIn]:
    return [MessageIn(role=role, content=content, id=ident) for ident, role, content in pairs]


async def test_an_append_stores_turns_in_order_and_a_retried_id_once(deps, caller):
    user, session = new_id("user"), new_id("session")
    first = await append_messages(
        deps, caller, session,
        AppendRequest(user_id=user, messages=turns(("m1", "user", "Book a table for two."), ("m2", "assistant", "For when?"))),
    )  # fmt: skip
    assert first.seqs == [1, 2] and first.duplicates == [False, False]
    retried = await append_messages(
        deps, caller, session,
        AppendRequest(user_id=user, messages=turns(("m2", "assistant", "For when?"), ("m3", "user", "Friday at eight."))),
    )  # fmt: skip
    assert retried.seqs == [2, 3] and retried.duplicates == [True, False]

    info = await describe_session(deps, caller.tenant, session)
    assert (info.user_id, info.message_count, info.covers_upto_seq) == (user, 3, 0)
    page = await read_page(deps, caller.tenant, session, after=0, limit=2)
    assert [(m.seq, m.role, m.content, m.id) for m in page.messages] == [
        (1, "user", "Book a table for two.", "m1"),
        (2, "assistant", "For when?", "m2"),
    ]
    assert page.next_after == 2
    rest = await read_page(deps, caller.tenant, session, after=page.next_after, limit=2)
    assert [m.content for m in rest.messages] == ["Friday at eight."] and rest.next_after is None
    assert [s["session_id"] for s in (await user_sessions(deps, caller.tenant, user)).sessions] == [session]

    with pytest.raises(SessionOwnerError):
        await append_messages(deps, caller, session, AppendRequest(user_id="someone-else", messages=turns(("x", "user", "hi"))))
    assert (await describe_session(deps, caller.tenant, session)).message_count == 3
    with pytest.raises(SessionNotFound):
        await describe_session(deps, "another-tenant", session)


async def test_a_delete_takes_the_log_and_the_owners_memories_and_leaves_the_rest(deps, caller):
    tenant, owner, other, session = caller.tenant, new_id("owner"), new_id("other"), new_id("session")
    said = ["I moved to Lisbon in March.", "My sister visits in June."]
    await append_messages(
        deps, caller, session, AppendRequest(user_id=owner, messages=[MessageIn(role="user", content=t) for t in said])
    )
    await memorized_turns(deps, tenant, owner, session, said)
    # Another user's memory under the same session id: made before an earlier log of that id expired.
    await memorized_turns(deps, tenant, other, session, ["The old conversation under this id."])
    kept = await add_memory(deps, tenant, owner, MemoryIn(text="Prefers invoices in EUR."))  # of no session

    deleted = await delete_session(deps, tenant, session)
    assert deleted.deleted and deleted.details == {"session": 1, "vectors": 2, "keywords": 2}
    assert await deps.stores.log.meta(tenant, session) is None
    assert await deps.stores.keywords.session_memories(tenant, owner, session, limit=10) == []
    assert [m["id"] for m in await deps.stores.vectors.list(tenant, owner, limit=10)] == [kept.id]
    assert len(await deps.stores.keywords.session_memories(tenant, other, session, limit=10)) == 1

    # The log is gone: the id no longer names a user, and a delete takes every memory made under it.
    swept = await delete_session(deps, tenant, session)
    assert swept.details == {"session": 0, "vectors": 1, "keywords": 1}
    assert await deps.stores.vectors.list(tenant, other, limit=10) == []
    assert await deps.stores.keywords.count(tenant) == 1  # the owner's memory of no session
    with pytest.raises(SessionNotFound):
        await delete_session(deps, tenant, session)
