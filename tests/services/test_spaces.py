"""services/spaces.py on the real stores: grants decide who reads and writes a space, search and
context read granted spaces beside the user's own memory and name them, promoted copies carry
their provenance, and forgetting a user takes the copies too (or pseudonymises them)."""

from __future__ import annotations

import pytest

from serve_app import schemas
from serve_app.core.auth import Caller, hash_key
from serve_app.errors import Forbidden, QuotaExceeded, SpaceForbidden, SpaceNotFound
from serve_app.schemas import ContextRequestIn, FactIn, MemoryIn, PromoteIn, SearchRequest, SpaceIn
from serve_app.services import spaces
from serve_app.services.context import build_working_memory
from serve_app.services.memories import add_memory, search_memories
from serve_app.services.users import forget, put_fact
from tests.services.seed import new_id


def _key(tenant: str, *, admin: bool = False) -> Caller:
    return Caller(tenant, hash_key(new_id("key")), admin=admin)


async def _space(deps, admin: Caller, **fields) -> str:
    name = new_id("team")
    await spaces.create_space(deps, admin, SpaceIn(space_id=name, **fields))
    return name


async def test_grants_decide_who_reads_writes_and_administers_a_space(deps, caller):
    admin, member, stranger = _key(caller.tenant, admin=True), _key(caller.tenant), _key(caller.tenant)
    with pytest.raises(Forbidden):
        await spaces.create_space(deps, member, SpaceIn(space_id="mine"))
    team = await _space(deps, admin)
    owner = spaces.space_owner(team)

    # No grant: the space is not there, whether it exists or not; nothing of it is listed.
    for who in (member, stranger, _key(new_id("tenant"))):
        with pytest.raises(SpaceNotFound):
            await spaces.granted_owners(deps, who, [team])
        assert team not in [s.space_id for s in await spaces.list_spaces(deps, who)]
    with pytest.raises(SpaceNotFound):
        await spaces.granted_owners(deps, admin, [new_id("absent")])

    await spaces.put_grant(deps, admin, team, member.actor, "read")
    assert await spaces.granted_owners(deps, member, [team]) == [owner]
    with pytest.raises(SpaceForbidden) as short:
        await spaces.require(deps, member, team, "write")
    assert short.value.status_code == 403
    with pytest.raises(SpaceForbidden):
        await spaces.put_grant(deps, member, team, stranger.actor, "admin")  # read cannot grant

    await spaces.put_grant(deps, admin, team, member.actor, "write")
    written = await add_memory(
        deps, caller.tenant, await spaces.require(deps, member, team, "write"),
        MemoryIn(text="The staging cluster is eu-west-3.", agent_id="deployer"), added_by=member.actor,
    )  # fmt: skip
    assert (written.agent_id, written.added_by) == ("deployer", member.actor)
    assert [(s.space_id, s.role, s.memories) for s in await spaces.list_spaces(deps, member)] == [(team, "write", 1)]
    grants = {g.principal: g.role for g in await spaces.list_grants(deps, admin, team)}
    assert grants == {admin.actor: "admin", member.actor: "write"}

    await spaces.revoke_grant(deps, admin, team, member.actor)
    with pytest.raises(SpaceNotFound):
        await spaces.granted_owners(deps, member, [team])
    audit = [(e.action, e.target.get("space")) for e in (await deps.stores.audit.page(caller.tenant, before=None, limit=10))]
    assert ("create_space", team) in audit and ("grant_space", team) in audit and ("revoke_space", team) in audit


async def test_search_and_context_read_granted_spaces_beside_the_user_and_name_them(deps, caller):
    admin, user, session = _key(caller.tenant, admin=True), new_id("user"), new_id("session")
    team = await _space(deps, admin)
    owner = spaces.space_owner(team)
    await add_memory(deps, caller.tenant, user, MemoryIn(text="I keep my deploy notes in the blue notebook."))
    await add_memory(deps, caller.tenant, owner, MemoryIn(text="Deploys to production need two approvals from the team."))
    await put_fact(deps, caller.tenant, owner, "deploy_window", FactIn(value="Tuesdays 10:00-12:00 UTC", category="decision"))
    query = "what do deploys to production need?"

    alone = await search_memories(deps, caller.tenant, user, SearchRequest(query=query))
    assert all(h.space is None for h in alone) and not any("approvals" in h.text for h in alone)
    both = await search_memories(deps, caller.tenant, user, SearchRequest(query=query, spaces=[team]), [owner])
    assert both[0].text.startswith("Deploys to production") and both[0].space == team
    assert {h.space for h in both} == {team, None}

    request = ContextRequestIn(user_id=user, session_id=session, query=query, spaces=[team])
    context = await build_working_memory(deps, caller.tenant, request, shared=[owner])
    prompt = context.messages[0]["content"]
    assert "space " + team in prompt and "two approvals" in prompt and "blue notebook" in prompt
    assert f"[space {team}] deploy_window (decision): Tuesdays" in prompt
    assert [f.space for f in context.facts] == [team]
    assert {h.space for h in context.recalled} == {team, None}
    plain = await build_working_memory(deps, caller.tenant, request.model_copy(update={"spaces": []}))
    assert "two approvals" not in plain.messages[0]["content"] and not plain.facts


async def test_a_promoted_copy_keeps_its_provenance_and_leaves_with_its_user(deps, caller):
    admin, user, other = _key(caller.tenant, admin=True), new_id("user"), new_id("user")
    team = await _space(deps, admin)
    owner = spaces.space_owner(team)
    mine = await add_memory(deps, caller.tenant, user, MemoryIn(text="The on-call phone PIN is 4417.", agent_id="triage"))
    theirs = await add_memory(deps, caller.tenant, other, MemoryIn(text="Rollbacks use the release-2 tag."))
    await put_fact(deps, caller.tenant, user, "pager", FactIn(value="PagerDuty rota B"))

    copy = await spaces.promote_memory(deps, admin, user, mine.id, PromoteIn(space=team))
    again = await spaces.promote_memory(deps, admin, user, mine.id, PromoteIn(space=team))
    assert again == copy and copy.id != mine.id
    assert (copy.origin_user, copy.origin_memory, copy.agent_id, copy.added_by) == (user, mine.id, "triage", admin.actor)
    kept = await spaces.promote_memory(deps, admin, other, theirs.id, PromoteIn(space=team))
    fact = await spaces.promote_fact(deps, admin, user, "pager", PromoteIn(space=team, agent_id="lead"))
    assert (fact.fact.origin_user, fact.fact.agent_id, fact.fact.space) == (user, "lead", team)
    assert await deps.stores.spaces.memory_count(caller.tenant, owner) == 2

    removed = await forget(deps, caller.tenant, user)
    assert removed.details["promoted_memories"] == 1 and removed.details["promoted_facts"] == 1
    left = await deps.stores.keywords.page(caller.tenant, owner, after="", limit=10)
    assert [h.id for h in left] == [kept.id]
    assert await deps.stores.vectors.fetch(caller.tenant, owner, [copy.id]) == []
    assert await deps.stores.facts.current(caller.tenant, owner) == []


async def test_forgetting_can_keep_promoted_copies_with_a_pseudonym(make_deps, caller):
    deps = make_deps(forget_promoted="pseudonymise")
    admin, user = _key(caller.tenant, admin=True), new_id("user")
    team = await _space(deps, admin)
    mine = await add_memory(deps, caller.tenant, user, MemoryIn(text="Customer Acme renews in March."))
    copy = await spaces.promote_memory(deps, admin, user, mine.id, PromoteIn(space=team))

    removed = await forget(deps, caller.tenant, user)
    assert removed.details["promoted_pseudonymised"] == 1
    [left] = await deps.stores.keywords.fetch(caller.tenant, spaces.space_owner(team), [copy.id])
    assert left.text == "Customer Acme renews in March."
    assert left.origin_user.startswith("forgotten-") and user not in left.origin_user


async def test_a_space_has_a_quota_and_its_deletion_removes_its_memory(make_deps, caller):
    deps = make_deps(space_quota_memories=1)
    admin = _key(caller.tenant, admin=True)
    team = await _space(deps, admin)
    owner = await spaces.require(deps, admin, team, "write")
    await spaces.check_space_quota(deps, caller.tenant, team, 1)
    await add_memory(deps, caller.tenant, owner, MemoryIn(text="Standup is at 9:30."))
    with pytest.raises(QuotaExceeded):
        await spaces.check_space_quota(deps, caller.tenant, team, 1)
    await put_fact(deps, caller.tenant, owner, "standup", FactIn(value="9:30"))

    member = _key(caller.tenant)
    await spaces.put_grant(deps, admin, team, member.actor, "write")
    with pytest.raises(SpaceForbidden):
        await spaces.delete_space(deps, member, team)
    gone = await spaces.delete_space(deps, admin, team)
    assert gone.details == {"keywords": 1, "vectors": 1, "facts": 1, "spaces": 1}
    with pytest.raises(SpaceNotFound):
        await spaces.get_space(deps, admin, team)
    assert await deps.stores.keywords.page(caller.tenant, owner, after="", limit=10) == []
    assert await spaces.list_spaces(deps, member) == []


def test_a_space_owner_id_is_no_user_id():
    with pytest.raises(ValueError):
        schemas.MemoryIn(text="x", id="space:team")
    assert spaces.space_owner("team") == "space:team"


async def test_the_users_list_steps_over_spaces(deps, caller):
    from serve_app.services.inspection import list_users

    admin, users = _key(caller.tenant, admin=True), sorted(new_id("user") for _ in range(3))
    for user in users:
        await add_memory(deps, caller.tenant, user, MemoryIn(text=f"{user} likes tea."))
    for _ in range(3):
        team = await _space(deps, admin)
        await add_memory(deps, caller.tenant, spaces.space_owner(team), MemoryIn(text="Shared."))
        await put_fact(deps, caller.tenant, spaces.space_owner(team), "k", FactIn(value="v"))
    seen, after = [], ""
    while True:
        page = await list_users(deps, caller.tenant, after=after, limit=1)
        seen += [u.user_id for u in page.users]
        if page.next_after is None:
            break
        after = page.next_after
    assert seen == users
