"""The audit log in PostgreSQL: one row per destructive call (who, what, when, what it removed).

Append-only: nothing in the service updates or deletes a row, forgetting a user included (the
entry names the user id and the counts removed, none of the user's content)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from serve_app.runtime.tracing import traced_store


@dataclass(frozen=True)
class AuditRecord:
    id: int
    at: datetime
    actor: str
    via: str
    action: str
    target: dict[str, str]
    result: dict[str, int]


@traced_store("postgresql")
class AuditLog:
    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    async def record(
        self, tenant: str, *, actor: str, via: str, action: str, target: dict[str, str], result: dict[str, int]
    ) -> int:
        return int(
            await self.pool.fetchval(
                "INSERT INTO audit_log (tenant_id, actor, via, action, target, result) VALUES ($1, $2, $3, $4, $5, $6)"
                " RETURNING id",
                tenant,
                actor,
                via,
                action,
                json.dumps(target),
                json.dumps(result),
            )
        )

    async def page(self, tenant: str, *, before: int | None, limit: int) -> list[AuditRecord]:
        """Newest first; `before` an id of the previous page."""
        rows = await self.pool.fetch(
            "SELECT id, at, actor, via, action, target, result FROM audit_log"
            " WHERE tenant_id = $1 AND ($2::bigint IS NULL OR id < $2) ORDER BY id DESC LIMIT $3",
            tenant,
            before,
            limit,
        )
        return [
            AuditRecord(r["id"], r["at"], r["actor"], r["via"], r["action"], json.loads(r["target"]), json.loads(r["result"]))
            for r in rows
        ]
