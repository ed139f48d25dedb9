"""What the service tests put in the stores before they ask: ids of their own, and the memories the
memorizer would have made of a session's turns (written as it writes them, without running it)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from serve_app.core.clock import datetime_to_ms
from serve_app.core.ids import turn_memory_id
from serve_app.services.dependencies import Dependencies
from serve_app.services.memory_writes import memory_row, save_memories


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def memorized_turns(deps: Dependencies, tenant: str, user: str, session: str, texts: list[str]) -> list[str]:
    """User turns at seqs 1.. of `session`, as turn memories of `user` in both indexes; their ids."""
    vectors = await deps.embed_documents(texts)
    now = datetime_to_ms(datetime.now(UTC))
    rows = [
        memory_row(
            deps.settings,
            memory_id=turn_memory_id(tenant, user, session, "user", text),
            tenant=tenant,
            user=user,
            text=text,
            created_at_ms=now,
            vector=vector,
            session=session,
            seq=seq,
            role="user",
            kind="turn",
        )
        for seq, (text, vector) in enumerate(zip(texts, vectors, strict=True), 1)
    ]
    await save_memories(deps.stores, rows)
    return [row.id for row in rows]
