"""Long-term memories live in two indexes (dense vectors in Milvus, keywords in PostgreSQL): every
write and delete goes through here so that the two never disagree for long.

A write is idempotent in both (deterministic ids, replace-on-retry), so a caller that failed half
way simply retries the whole write; a delete removes from both and reports each count.

PostgreSQL (fsync on commit) is the record: it holds every memory's text and origin. Milvus Lite
acknowledges a write before it is on disk, and a kill -9 loses the last ones (bench/reliability.py
once lost 187 of 382 acknowledged vectors that way), so after Milvus restarts `repair_vectors`
embeds again what PostgreSQL has and Milvus lacks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from serve_app.services.stores import Stores
from serve_app.stores.vectors import Hit, MemoryRow

logger = logging.getLogger("ray.serve")
EmbedMany = Callable[[list[str]], Awaitable[list[list[float]]]]


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
    # The record first: a repair that runs meanwhile re-embeds only what PostgreSQL still holds, so
    # it cannot bring back a memory this delete has taken out of Milvus.
    keywords = await stores.keywords.delete(tenant, user=user, session=session, memory_id=memory_id)
    vectors = await stores.vectors.delete(**scope)
    return {"vectors": vectors, "keywords": keywords}


async def repair_vectors(stores: Stores, embed: EmbedMany, *, chunk: int = 256) -> int:
    """Give Milvus back every memory PostgreSQL holds and Milvus lacks (same text, same model,
    so the same vector); returns how many rows were written. Idempotent, safe to run any time."""
    repaired = 0
    for tenant, user in await stores.keywords.users():
        ids = await stores.keywords.memory_ids(tenant, user)
        missing = sorted(await stores.vectors.missing(tenant, user, ids))
        for start in range(0, len(missing), chunk):
            hits = await stores.keywords.fetch(tenant, user, missing[start : start + chunk])
            if not hits:
                continue
            vectors = await embed([h.text for h in hits])
            rows = [_row(tenant, user, h, v) for h, v in zip(hits, vectors, strict=True)]
            await stores.vectors.upsert(rows)
            # A delete that ran between the fetch and the upsert took the row out of PostgreSQL:
            # take this copy out of Milvus too. A rewrite of the same id meanwhile: write it again.
            now = {h.id: h for h in await stores.keywords.fetch(tenant, user, [r.id for r in rows])}
            for row in rows:
                if row.id not in now:
                    await stores.vectors.delete(tenant_id=tenant, user_id=user, id=row.id)
            changed = [now[r.id] for r in rows if r.id in now and now[r.id].text != r.text]
            if changed:
                again = await embed([h.text for h in changed])
                await stores.vectors.upsert([_row(tenant, user, h, v) for h, v in zip(changed, again, strict=True)])
            repaired += len(now)
        if missing:
            logger.warning("repaired %d vectors of %s/%s that Milvus had lost", len(missing), tenant, user)
    return repaired


def _row(tenant: str, user: str, hit: Hit, vector: list[float]) -> MemoryRow:
    return MemoryRow(hit.id, tenant, user, hit.session_id, hit.seq, hit.role, hit.kind, hit.text, hit.created_at_ms, vector)
