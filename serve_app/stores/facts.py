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
from serve_app.runtime.tracing import traced_store
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
    agent_id: str | None = None
    added_by: str | None = None
    origin_user: str | None = None
    said_at: datetime | None = None
    """When the user said it (the source turn's time); None for a fact written through the API."""

    @property
    def since(self) -> datetime:
        """When it holds from for its reader: when it was said, else when it was written."""
        return self.said_at or self.valid_from

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
            agent_id=row.get("agent_id"),
            added_by=row.get("added_by"),
            origin_user=row.get("origin_user"),
            said_at=row.get("said_at"),
        )


_COLUMNS = "key, value, category, source_session, source_seqs, valid_from, valid_to, agent_id, added_by, origin_user, said_at"


@traced_store("postgresql")
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
        agent_id: str | None = None,
        added_by: str | None = None,
        origin_user: str | None = None,
        said_at: datetime | None = None,
    ) -> tuple[Fact, bool]:
        """Make `value` current, closing the previous row; (fact, changed). Same value = no new row.
        `said_at`: when the user said it, for a fact found in a turn."""
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
                "INSERT INTO facts (tenant_id, user_id, key, value, category, source_session, source_seqs,"
                f" agent_id, added_by, origin_user, said_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
                f" RETURNING {_COLUMNS}",
                tenant,
                user,
                key,
                value,
                category,
                source_session,
                source_seqs or [],
                agent_id,
                added_by,
                origin_user,
                said_at,
            )
            return Fact.from_row(new), True

    async def every_row(self, tenant: str, user: str) -> list[Fact]:
        """Every row of every fact of the user, closed ones included: by key, oldest first."""
        rows = await self.pool.fetch(
            f"SELECT {_COLUMNS} FROM facts WHERE tenant_id=$1 AND user_id=$2 ORDER BY key, valid_from, id",
            tenant,
            user,
        )
        return [Fact.from_row(r) for r in rows]

    async def restore(self, tenant: str, user: str, rows: list[Fact]) -> int:
        """Write rows of history as they were (an import): a row whose key and `valid_from` the user
        holds already is skipped, so restoring twice adds nothing. An open row closes the user's
        open row of its key that began before it; one that began after it closes the restored row.
        One transaction: all of them or none. Returns the rows added."""
        added = 0
        async with self.pool.acquire() as conn, conn.transaction():
            for fact in sorted(rows, key=lambda f: (f.key, f.valid_from)):
                if fact.category not in FACT_CATEGORIES:
                    raise InvalidRequest(f"fact {fact.key}: category must be one of {', '.join(FACT_CATEGORIES)}")
                await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", f"{tenant}\x1f{user}\x1f{fact.key}")
                held = await conn.fetchval(
                    "SELECT 1 FROM facts WHERE tenant_id=$1 AND user_id=$2 AND key=$3 AND valid_from=$4",
                    tenant,
                    user,
                    fact.key,
                    fact.valid_from,
                )
                if held:
                    continue
                valid_to = fact.valid_to
                if valid_to is None:
                    open_row = await conn.fetchrow(
                        "SELECT id, valid_from FROM facts WHERE tenant_id=$1 AND user_id=$2 AND key=$3 AND valid_to IS NULL",
                        tenant,
                        user,
                        fact.key,
                    )
                    if open_row is not None and open_row["valid_from"] < fact.valid_from:
                        await conn.execute("UPDATE facts SET valid_to = $2 WHERE id = $1", open_row["id"], fact.valid_from)
                    elif open_row is not None:
                        valid_to = open_row["valid_from"]
                await conn.execute(
                    "INSERT INTO facts (tenant_id, user_id, key, value, category, source_session, source_seqs,"
                    " valid_from, valid_to, agent_id, added_by, origin_user, said_at)"
                    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
                    tenant,
                    user,
                    fact.key,
                    fact.value,
                    fact.category,
                    fact.source_session,
                    fact.source_seqs,
                    fact.valid_from,
                    valid_to,
                    fact.agent_id,
                    fact.added_by,
                    fact.origin_user,
                    fact.said_at,
                )
                added += 1
        return added

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

    async def forget_promoted(self, tenant: str, user: str) -> int:
        """Erase the rows promoted from the user's facts into spaces; returns the count."""
        status = await self.pool.execute("DELETE FROM facts WHERE tenant_id=$1 AND origin_user=$2", tenant, user)
        return int(status.split()[-1])

    async def pseudonymise(self, tenant: str, user: str, alias: str) -> int:
        """Name the user by `alias` in the provenance of the rows promoted from its facts."""
        status = await self.pool.execute(
            "UPDATE facts SET origin_user = $3 WHERE tenant_id=$1 AND origin_user=$2", tenant, user, alias
        )
        return int(status.split()[-1])
