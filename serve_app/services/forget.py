"""Forget a user: every store, history included, behind a tombstone so nothing comes back."""

from __future__ import annotations

from serve_app.services.memories import delete_memories
from serve_app.services.stores import Stores


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
    await stores.log.redis.delete(stores.log.user_sessions_key(tenant, user))
    return {"sessions": removed_sessions, **memories, "facts": facts}
