"""services/audit.py on the real stores: a destructive call that removed something leaves one entry
in its tenant's audit log, newest first, naming the actor by its key's digest prefix, the way it
came in, the target and what it removed; a call that removed nothing leaves none."""

from __future__ import annotations

from serve_app.core.auth import Caller
from serve_app.schemas import AppendRequest, FactIn, MessageIn
from serve_app.services.audit import audit_page, audited
from serve_app.services.sessions import append_messages, delete_session
from serve_app.services.users import forget, put_fact
from tests.services.seed import new_id


async def test_an_audited_delete_is_read_back_with_its_actor_way_in_target_and_counts(deps, caller):
    tenant, user, session = caller.tenant, new_id("user"), new_id("session")
    said = [MessageIn(role="user", content="Cancel my gym membership.")]
    await append_messages(deps, caller, session, AppendRequest(user_id=user, messages=said))
    await put_fact(deps, tenant, user, "gym", FactIn(value="cancelled"))

    done = await audited(deps, caller, "delete_session", {"session_id": session}, delete_session(deps, tenant, session))
    assert done.deleted
    inspector = Caller(tenant, caller.key_digest, via="inspector")
    await audited(deps, inspector, "forget_user", {"user_id": user}, forget(deps, tenant, user))
    nothing = await audited(deps, caller, "forget_user", {"user_id": "nobody"}, forget(deps, tenant, "nobody"))
    assert not nothing.deleted

    page = await audit_page(deps, tenant, before=None, limit=10)
    assert [(e.action, e.via, e.target) for e in page.entries] == [
        ("forget_user", "inspector", {"user_id": user}),
        ("delete_session", "api", {"session_id": session}),
    ]
    assert {e.actor for e in page.entries} == {f"key:{caller.key_digest[:12]}"}
    assert page.entries[0].result == {
        "sessions": 0, "vectors": 0, "keywords": 0, "facts": 1, "promoted_memories": 0, "promoted_facts": 0,
    }
    assert page.entries[1].result == {"session": 1, "vectors": 0, "keywords": 0} and page.next_before is None

    newest = await audit_page(deps, tenant, before=None, limit=1)
    assert [e.action for e in newest.entries] == ["forget_user"] and newest.next_before == newest.entries[0].id
    older = await audit_page(deps, tenant, before=newest.next_before, limit=1)
    assert [e.action for e in older.entries] == ["delete_session"] and older.next_before is None
    assert (await audit_page(deps, new_id("tenant"), before=None, limit=10)).entries == []


async def test_with_keys_off_the_actor_is_local(deps):
    local = Caller(new_id("tenant"), "local")
    session = new_id("session")
    await append_messages(deps, local, session, AppendRequest(user_id="u", messages=[MessageIn(role="user", content="x")]))
    await audited(deps, local, "delete_session", {"session_id": session}, delete_session(deps, local.tenant, session))
    (entry,) = (await audit_page(deps, local.tenant, before=None, limit=10)).entries
    assert (entry.actor, entry.via, entry.action) == ("local", "api", "delete_session")
