"""A user's structured facts (current values with full history), and forgetting a user everywhere."""

from __future__ import annotations

from serve_app import schemas
from serve_app.core.ids import pseudonym
from serve_app.errors import FactNotFound
from serve_app.services.dependencies import Dependencies
from serve_app.services.memory_writes import delete_memories
from serve_app.stores.bundle import Stores
from serve_app.stores.facts import Fact


def fact_out(fact: Fact, space: str | None = None) -> schemas.FactOut:
    return schemas.FactOut(**fact.__dict__, space=space)


async def current_facts(deps: Dependencies, tenant: str, user_id: str) -> list[schemas.FactOut]:
    return [fact_out(f) for f in await deps.stores.facts.current(tenant, user_id)]


async def get_fact(deps: Dependencies, tenant: str, user_id: str, key: str) -> schemas.FactOut:
    fact = await deps.stores.facts.get(tenant, user_id, key)
    if fact is None:
        raise FactNotFound()
    return fact_out(fact)


async def put_fact(
    deps: Dependencies, tenant: str, user_id: str, key: str, body: schemas.FactIn, *, added_by: str | None = None
) -> schemas.FactWrite:
    """Make the value current; the previous one is closed, not erased (same value: no new row)."""
    fact, changed = await deps.stores.facts.put(
        tenant,
        user_id,
        key,
        body.value,
        body.category,
        source_session=body.source_session,
        source_seqs=body.source_seqs,
        agent_id=body.agent_id,
        added_by=added_by,
    )
    return schemas.FactWrite(fact=fact_out(fact), changed=changed)


async def close_fact(deps: Dependencies, tenant: str, user_id: str, key: str) -> schemas.Deleted:
    if not await deps.stores.facts.delete(tenant, user_id, key):
        raise FactNotFound()
    return schemas.Deleted(deleted=True, details={"facts": 1})


async def fact_history(deps: Dependencies, tenant: str, user_id: str, key: str) -> list[schemas.FactOut]:
    rows = await deps.stores.facts.history(tenant, user_id, key)
    if not rows:
        raise FactNotFound()
    return [fact_out(f) for f in rows]


async def forget_user(stores: Stores, tenant: str, user: str) -> dict[str, int]:
    """Delete the user's sessions, vectors, keyword index entries and facts; returns what was removed from each store.

    The tombstone goes first: a memorizer that read a session before this call checks it before
    writing, and deletes what it wrote if the tombstone appeared meanwhile.
    """
    await stores.log.set_tombstone(tenant, user)
    sessions = [s for s, _ in await stores.log.user_sessions(tenant, user)]
    removed_sessions = 0
    for session in sessions:
        removed_sessions += int(await stores.log.delete(tenant, session))
    memories = await delete_memories(stores, tenant, user=user)
    facts = await stores.facts.forget(tenant, user)
    await stores.log.forget_user_sessions(tenant, user)
    return {"sessions": removed_sessions, **memories, "facts": facts}


async def forget(deps: Dependencies, tenant: str, user_id: str) -> schemas.Deleted:
    removed = await forget_user(deps.stores, tenant, user_id)
    removed |= await forget_promoted(deps.stores, tenant, user_id, deps.settings.forget_promoted)
    return schemas.Deleted(deleted=any(removed.values()), details=removed)


async def forget_promoted(stores: Stores, tenant: str, user: str, how: str) -> dict[str, int]:
    """What forgetting a user does to the copies promoted from the user's memory into spaces:
    `delete` removes them (the default: the user's words leave with the user), `pseudonymise`
    keeps them for the team with the user's id in their provenance replaced by a pseudonym."""
    if how == "pseudonymise":
        alias = pseudonym(tenant, user)
        return {
            "promoted_pseudonymised": await stores.keywords.pseudonymise(tenant, user, alias)
            + await stores.facts.pseudonymise(tenant, user, alias)
        }
    removed = {"promoted_memories": 0, "promoted_facts": 0}
    for owner, memory_id in await stores.keywords.promoted_from(tenant, user):
        counts = await delete_memories(stores, tenant, user=owner, memory_id=memory_id)
        removed["promoted_memories"] += int(counts["keywords"] > 0 or counts["vectors"] > 0)
    removed["promoted_facts"] = await stores.facts.forget_promoted(tenant, user)
    return removed
