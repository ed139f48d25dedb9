"""Structured long-term facts in PostgreSQL, bi-temporal: an update or delete closes the old row.

`(tenant_id, user_id, key)` has at most one open row (a partial unique index), so history is never
erased and two concurrent writers cannot both make their value current.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from serve_app.core.records import FACT_CATEGORIES
from serve_app.errors import InvalidRequest
from serve_app.stores.pg_pool import create_pool
from serve_app.stores.pg_schema import migrate


@dataclass
class Fact:
    key: str
    value: str
    category: str
    source_session: str | None
    source_seqs: list[int]
    valid_from: datetime
    valid_to: datetime | None

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> Fact:
        return cls(
            key=row["key"],
            value=row["value"],
            category=row["category"],
            source_session=row["source_session"],
            source_seqs=list(row["source_seqs"]),
            valid_from=row["valid_from"],
            valid_to=row["valid_to"],
        )


_COLUMNS = "key, value, category, source_session, source_seqs, valid_from, valid_to"


class FactStore:
    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    @classmethod
    async def connect(cls, dsn: str, *, min_size: int = 1, max_size: int = 8) -> FactStore:
        pool = await create_pool(dsn, min_size=min_size, max_size=max_size)
        await migrate(pool)
        return cls(pool)

    async def close(self) -> None:
        await self.pool.close()

    async def ping(self) -> bool:
        return await self.pool.fetchval("SELECT 1") == 1

    async def current(self, tenant: str, user: str) -> list[Fact]:
        rows = await self.pool.fetch(
            f"SELECT {_COLUMNS} FROM facts WHERE tenant_id=$1 AND user_id=$2 AND valid_to IS NULL ORDER BY key",
            tenant,
            user,
        )
        return [Fact.from_row(r) for r in rows]

    async def get(self, tenant: str, user: str, key: str) -> Fact | None:
        row = await self.pool.fetchrow(
            f"SELECT {_COLUMNS} FROM facts WHERE tenant_id=$1 AND user_id=$2 AND key=$3 AND valid_to IS NULL",
            tenant,
            user,
            key,
        )
        return Fact.from_row(row) if row else None

    async def history(self, tenant: str, user: str, key: str) -> list[Fact]:
        rows = await self.pool.fetch(
            f"SELECT {_COLUMNS} FROM facts WHERE tenant_id=$1 AND user_id=$2 AND key=$3 ORDER BY valid_from, id",
            tenant,
            user,
            key,
        )
        return [Fact.from_row(r) for r in rows]

    async def put(
        self,
        tenant: str,
        user: str,
        key: str,
        value: str,
        category: str,
        *,
        source_session: str | None = None,
        source_seqs: list[int] | None = None,
    ) -> tuple[Fact, bool]:
        """Make `value` current, closing the previous row; (fact, changed). Same value = no new row."""
        if category not in FACT_CATEGORIES:
            raise InvalidRequest(f"category must be one of {', '.join(FACT_CATEGORIES)}")
        async with self.pool.acquire() as conn, conn.transaction():
            # Serialize writers of one key so the close-then-insert pair is atomic for them.
            await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", f"{tenant}\x1f{user}\x1f{key}")
            row = await conn.fetchrow(
                f"SELECT id, {_COLUMNS} FROM facts WHERE tenant_id=$1 AND user_id=$2 AND key=$3 AND valid_to IS NULL",
                tenant,
                user,
                key,
            )
            if row and row["value"] == value and row["category"] == category:
                return Fact.from_row(row), False
            if row:
                await conn.execute("UPDATE facts SET valid_to = clock_timestamp() WHERE id = $1", row["id"])
            new = await conn.fetchrow(
                "INSERT INTO facts (tenant_id, user_id, key, value, category, source_session, source_seqs)"
                f" VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING {_COLUMNS}",
                tenant,
                user,
                key,
                value,
                category,
                source_session,
                source_seqs or [],
            )
            return Fact.from_row(new), True

    async def delete(self, tenant: str, user: str, key: str) -> bool:
        """Close the current row; its history stays readable."""
        status = await self.pool.execute(
            "UPDATE facts SET valid_to = clock_timestamp() WHERE tenant_id=$1 AND user_id=$2 AND key=$3 AND valid_to IS NULL",
            tenant,
            user,
            key,
        )
        return status.endswith(" 1")

    async def forget(self, tenant: str, user: str) -> int:
        """Erase every row of the user, history included (right to be forgotten); returns the count."""
        status = await self.pool.execute("DELETE FROM facts WHERE tenant_id=$1 AND user_id=$2", tenant, user)
        return int(status.split()[-1])
