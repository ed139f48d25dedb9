"""Memorization as a cursor: embed the turns after `memorized_upto_seq`, then compact if due.

At-least-once work with an exactly-once effect: vector ids are deterministic, so redoing a batch
after a crash upserts the same rows; the cursor moves only after Milvus confirmed the write.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from serve_app.core.ids import turn_memory_id
from serve_app.services.compaction import compact_session
from serve_app.settings import Settings
from serve_app.stores.session_log import SessionLog
from serve_app.stores.vectors import MemoryRow, VectorStore

logger = logging.getLogger("ray.serve")
Embed = Callable[[list[str]], Awaitable[list[list[float]]]]
MEMORIZED_ROLES = ("user", "assistant")


def created_ms(turn: dict) -> int:
    try:
        return int(datetime.fromisoformat(turn["created_at"]).timestamp() * 1000)
    except (KeyError, ValueError):
        return 0


class SessionMemorizer:
    def __init__(self, log: SessionLog, vectors: VectorStore, embed: Embed, settings: Settings):
        self.log = log
        self.vectors = vectors
        self.embed = embed
        self.settings = settings

    async def memorize(self, tenant: str, session: str, on_conflict=lambda: None) -> int:
        """Bring the session's cursor to its last seq; returns the cursor (-1 if the session is gone)."""
        batch = self.settings.memorizer_batch_size
        while True:
            meta = await self.log.meta(tenant, session)
            if meta is None:
                await self.log.advance_cursor(tenant, session, 0, done=True)  # drops it from pending
                return -1
            turns = await self.log.read(tenant, session, after=meta.memorized_upto_seq, limit=batch)
            if turns:
                items = [t for t in turns if t["role"] in MEMORIZED_ROLES and (t.get("content") or "").strip()]
                vectors = await self.embed([t["content"] for t in items]) if items else []
                rows = [
                    MemoryRow(
                        id=turn_memory_id(tenant, session, t["seq"]),
                        tenant_id=tenant,
                        user_id=meta.user_id,
                        session_id=session,
                        seq=t["seq"],
                        role=t["role"],
                        kind="turn",
                        text=t["content"],
                        created_at_ms=created_ms(t),
                        vector=vector,
                    )
                    for t, vector in zip(items, vectors, strict=False)
                ]
                await self.vectors.upsert(rows)
                if await self.log.meta(tenant, session) is None:
                    # Deleted while we embedded: remove what we just wrote, leave nothing behind.
                    await self.vectors.delete(tenant_id=tenant, session_id=session)
                    return -1
            done = len(turns) < batch
            if done:
                await compact_session(
                    self.log,
                    tenant,
                    session,
                    trigger_tokens=self.settings.compaction_trigger_tokens,
                    keep_rounds=self.settings.compaction_keep_rounds,
                    summary_max_tokens=self.settings.summary_max_tokens,
                    force=False,
                    on_conflict=on_conflict,
                )
            upto = turns[-1]["seq"] if turns else meta.memorized_upto_seq
            cursor = await self.log.advance_cursor(tenant, session, upto, done=done)
            if done:
                return cursor
