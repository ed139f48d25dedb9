"""Long-term memories live in two indexes (dense vectors in Milvus, keywords in PostgreSQL): every
write and delete goes through here so that the two never disagree for long.

A write is idempotent in both (deterministic ids, replace-on-retry), so a caller that failed half
way simply retries the whole write; a delete removes from both and reports each count.
"""

from __future__ import annotations

import asyncio

from serve_app.services.stores import Stores
from serve_app.stores.vectors import MemoryRow


async def save_memories(stores: Stores, rows: list[MemoryRow]) -> int:
    if not rows:
        return 0
    written, _ = await asyncio.gather(stores.vectors.upsert(rows), stores.keywords.upsert(rows))
    return written


async def delete_memories(
    stores: Stores, tenant: str, *, user: str | None = None, session: str | None = None, memory_id: str | None = None
) -> dict[str, int]:
    """Delete by user, session or one memory id; returns the rows removed from each index."""
    scope: dict[str, str] = {"tenant_id": tenant}
    for field, value in (("user_id", user), ("session_id", session), ("id", memory_id)):
        if value is not None:
            scope[field] = value
    vectors, keywords = await asyncio.gather(
        stores.vectors.delete(**scope), stores.keywords.delete(tenant, user=user, session=session, memory_id=memory_id)
    )
    return {"vectors": vectors, "keywords": keywords}
