"""Memory spaces: a tenant's shared memory, the grants keys hold on it, and copies promoted into it.

Every operation on a space first reads the caller's grant on it (one PostgreSQL query for all the
spaces a request names), then works on the space's owner id only: the spaces a key may not read
never enter a store query. A space that does not exist and one without a grant answer alike (404).
"""

from __future__ import annotations

from collections.abc import Sequence

from serve_app import schemas
from serve_app.core.auth import Caller
from serve_app.core.ids import promoted_memory_id
from serve_app.core.spaces import Role, denied, space_owner, unique
from serve_app.errors import Conflict, FactNotFound, Forbidden, MemoryNotFound, QuotaExceeded, SpaceForbidden, SpaceNotFound
from serve_app.services.audit import record
from serve_app.services.dependencies import Dependencies
from serve_app.services.memories import add_memory, memory_out
from serve_app.services.memory_writes import Provenance, delete_memories, memory_row, save_memories
from serve_app.services.quota import check_memory_quota
from serve_app.services.users import fact_out
from serve_app.stores.spaces import Space


async def roles_of(deps: Dependencies, who: Caller, spaces: Sequence[str]) -> dict[str, Role]:
    """The caller's role on each named space that exists and that it may see."""
    if who.admin:
        return dict.fromkeys(await deps.stores.spaces.existing(who.tenant, list(spaces)), "admin")
    return await deps.stores.spaces.roles(who.tenant, who.actor, list(spaces))


async def granted_owners(deps: Dependencies, who: Caller, spaces: Sequence[str], need: Role = "read") -> list[str]:
    """The owner ids of the named spaces, once the caller is shown to hold `need` on every one;
    none named: none, and no query."""
    if not spaces:
        return []
    named = unique(spaces)
    roles = await roles_of(deps, who, named)
    if unseen := [s for s in named if s not in roles]:
        raise SpaceNotFound(unseen)
    if short := denied(named, roles, need):
        raise SpaceForbidden(short, need)
    return [space_owner(s) for s in named]


async def require(deps: Dependencies, who: Caller, space: str, need: Role) -> str:
    """The owner id of one space the caller holds `need` on."""
    return (await granted_owners(deps, who, [space], need))[0]


async def _space_out(deps: Dependencies, space: Space, role: Role | None, tenant: str) -> schemas.SpaceOut:
    memories = await deps.stores.spaces.memory_count(tenant, space_owner(space.space_id))
    return schemas.SpaceOut(**space.__dict__, role=role, memories=memories)


async def create_space(deps: Dependencies, who: Caller, body: schemas.SpaceIn) -> schemas.SpaceOut:
    """Made by the tenant's admin, who holds admin on it; an existing space is left as it is (409)."""
    if not who.admin:
        raise Forbidden("creating a memory space needs the tenant's admin key (':admin' in the key file)")
    quota = deps.settings.space_quota_memories if body.quota_memories is None else body.quota_memories
    if not await deps.stores.spaces.create(who.tenant, body.space_id, quota_memories=quota, created_by=who.actor):
        raise Conflict(f"memory space {body.space_id} exists")
    await record(deps, who, "create_space", {"space": body.space_id}, {"quota_memories": quota})
    space = await deps.stores.spaces.get(who.tenant, body.space_id)
    assert space is not None
    return await _space_out(deps, space, "admin", who.tenant)


async def list_spaces(deps: Dependencies, who: Caller) -> list[schemas.SpaceOut]:
    """The spaces the caller holds a grant on (all of the tenant's for its admin)."""
    seen = await deps.stores.spaces.visible(who.tenant, who.actor, every=who.admin)
    return [await _space_out(deps, space, "admin" if who.admin else role, who.tenant) for space, role in seen]


async def get_space(deps: Dependencies, who: Caller, space_id: str) -> schemas.SpaceOut:
    roles = await roles_of(deps, who, [space_id])
    space = await deps.stores.spaces.get(who.tenant, space_id) if space_id in roles else None
    if space is None:
        raise SpaceNotFound([space_id])
    return await _space_out(deps, space, roles[space_id], who.tenant)


async def delete_space(deps: Dependencies, who: Caller, space_id: str) -> schemas.Deleted:
    """The space's memories and facts (history included), then the space and its grants; audited."""
    owner = await require(deps, who, space_id, "admin")
    memories = await delete_memories(deps.stores, who.tenant, user=owner)
    facts = await deps.stores.facts.forget(who.tenant, owner)
    await deps.stores.spaces.delete(who.tenant, space_id)
    removed = {**memories, "facts": facts, "spaces": 1}
    await record(deps, who, "delete_space", {"space": space_id}, removed)
    return schemas.Deleted(deleted=True, details=removed)


async def list_grants(deps: Dependencies, who: Caller, space_id: str) -> list[schemas.GrantOut]:
    await require(deps, who, space_id, "admin")
    return [schemas.GrantOut(**g.__dict__) for g in await deps.stores.spaces.grants(who.tenant, space_id)]


async def put_grant(deps: Dependencies, who: Caller, space_id: str, principal: str, role: Role) -> schemas.GrantOut:
    await require(deps, who, space_id, "admin")
    if await deps.stores.spaces.grant(who.tenant, space_id, principal, role, granted_by=who.actor):
        await record(deps, who, "grant_space", {"space": space_id, "principal": principal, "role": role}, {"grants": 1})
    grant = next(g for g in await deps.stores.spaces.grants(who.tenant, space_id) if g.principal == principal)
    return schemas.GrantOut(**grant.__dict__)


async def revoke_grant(deps: Dependencies, who: Caller, space_id: str, principal: str) -> schemas.Deleted:
    await require(deps, who, space_id, "admin")
    if not await deps.stores.spaces.revoke(who.tenant, space_id, principal):
        raise SpaceNotFound([f"{space_id} (no grant for {principal})"])
    await record(deps, who, "revoke_space", {"space": space_id, "principal": principal}, {"grants": 1})
    return schemas.Deleted(deleted=True, details={"grants": 1})


async def check_space_quota(deps: Dependencies, tenant: str, space_id: str, adding: int) -> None:
    """The space's own quota (0: none of its own); every write checks the tenant's too, where it
    checks it for a user's."""
    space = await deps.stores.spaces.get(tenant, space_id)
    if space is not None and space.quota_memories > 0:
        used = await deps.stores.spaces.memory_count(tenant, space_owner(space_id))
        if used + adding > space.quota_memories:
            raise QuotaExceeded(space.quota_memories, used)


async def add_space_memory(deps: Dependencies, who: Caller, space: str, body: schemas.MemoryIn) -> schemas.MemoryOut:
    """A memory added to a space directly (write grant), within the space's quota and the tenant's."""
    owner = await require(deps, who, space, "write")
    await check_space_quota(deps, who.tenant, space, 1)
    return await add_memory(deps, who.tenant, owner, body, added_by=who.actor)


async def promote_memory(
    deps: Dependencies, who: Caller, user_id: str, memory_id: str, body: schemas.PromoteIn
) -> schemas.MemoryOut:
    """Copy one of the user's memories into a space, with where it came from (idempotent: the copy's
    id is made from the space, the user and the memory); audited."""
    owner = await require(deps, who, body.space, "write")
    found = await deps.stores.keywords.fetch(who.tenant, user_id, [memory_id])
    if not found:
        raise MemoryNotFound()
    source = found[0]
    copy_id = promoted_memory_id(who.tenant, owner, user_id, memory_id)
    if held := await deps.stores.keywords.fetch(who.tenant, owner, [copy_id]):
        return memory_out(held[0])
    await check_memory_quota(deps, who.tenant, 1)
    await check_space_quota(deps, who.tenant, body.space, 1)
    stored = await deps.stores.vectors.vectors_of(who.tenant, user_id, [memory_id])
    vector = stored.get(memory_id) or (await deps.embed_documents([source.text]))[0]
    row = memory_row(
        deps.settings,
        memory_id=copy_id,
        tenant=who.tenant,
        user=owner,
        text=source.text,
        created_at_ms=source.created_at_ms,
        vector=vector,
        session=source.session_id,
        seq=source.seq,
        role=source.role,
        kind=source.kind,
        provenance=Provenance(body.agent_id or source.agent_id, who.actor, user_id, memory_id),
    )
    await save_memories(deps.stores, [row])
    await record(deps, who, "promote_memory", {"user_id": user_id, "memory_id": memory_id, "space": body.space}, {"memories": 1})
    return memory_out((await deps.stores.keywords.fetch(who.tenant, owner, [copy_id]))[0])


async def promote_fact(deps: Dependencies, who: Caller, user_id: str, key: str, body: schemas.PromoteIn) -> schemas.FactWrite:
    """Make the user's current value of a fact the space's, with where it came from; audited."""
    owner = await require(deps, who, body.space, "write")
    fact = await deps.stores.facts.get(who.tenant, user_id, key)
    if fact is None:
        raise FactNotFound()
    written, changed = await deps.stores.facts.put(
        who.tenant,
        owner,
        key,
        fact.value,
        fact.category,
        source_session=fact.source_session,
        source_seqs=fact.source_seqs,
        agent_id=body.agent_id or fact.agent_id,
        added_by=who.actor,
        origin_user=user_id,
        said_at=fact.said_at,
    )
    if changed:
        await record(deps, who, "promote_fact", {"user_id": user_id, "key": key, "space": body.space}, {"facts": 1})
    return schemas.FactWrite(fact=fact_out(written, body.space), changed=changed)

