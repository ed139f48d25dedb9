"""Long-term memories live in two indexes (dense vectors in Milvus, keywords in PostgreSQL): every
write and delete goes through here so that the two never disagree for long.

A write is idempotent in both (deterministic ids, replace-on-retry), so a caller that failed half
way simply retries the whole write; a delete removes from both and reports each count. PostgreSQL
(fsync on commit) is the record: it holds every memory's text and origin, and what Milvus loses is
written again from it (`services/index_repair`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import NamedTuple

from serve_app.core.clock import ms_to_datetime
from serve_app.core.keywords import memory_keywords
from serve_app.core.records import MemoryRow
from serve_app.encoding import Vector
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores

DIRECT = "memory"  # role and kind of a memory added directly, not memorized from a turn


class Provenance(NamedTuple):
    """Who wrote a memory and where a promoted copy came from (PostgreSQL keeps it)."""

    agent_id: str | None = None
    added_by: str | None = None
    origin_user: str | None = None
    origin_memory: str | None = None


def memory_row(
    settings: Settings,
    *,
    memory_id: str,
    tenant: str,
    user: str,
    text: str,
    created_at_ms: int,
    vector: Vector,
    session: str = "",
    seq: int = 0,
    role: str = DIRECT,
    kind: str = DIRECT,
    before: Sequence[str] = (),
    provenance: Provenance | None = None,
) -> MemoryRow:
    """A memory as both indexes store it; `before` are the turns that precede a turn memory (its
    keyword text carries them, so a short reply is found through what it answers)."""
    day = ms_to_datetime(created_at_ms).date() if created_at_ms else None
    return MemoryRow(
        id=memory_id,
        tenant_id=tenant,
        user_id=user,
        session_id=session,
        seq=seq,
        role=role,
        kind=kind,
        text=text,
        created_at_ms=created_at_ms,
        vector=vector,
        keywords=memory_keywords(
            text,
            before=before,
            day=day,
            weight=settings.recall_keyword_self_weight,
            context_chars=settings.recall_keyword_context_chars,
        ),
        context=tuple(before),
        **(provenance._asdict() if provenance else {}),
    )


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
