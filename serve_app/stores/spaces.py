"""Memory spaces and the grants keys hold on them, in PostgreSQL (migration 10).

A space's memories and facts are in the memory and fact tables under the owner id
`core.spaces.space_owner(space)`; this store holds which spaces exist and who may do what on each.
A grant names a key as the audit log does (`Caller.actor`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from serve_app.core.spaces import Role
from serve_app.runtime.tracing import traced_store


@dataclass(frozen=True)
class Space:
    space_id: str
    quota_memories: int
    created_by: str
    created_at: datetime


@dataclass(frozen=True)
class Grant:
    principal: str
    role: Role
    granted_by: str
    granted_at: datetime


@traced_store("postgresql")
class SpaceStore:
    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    async def create(self, tenant: str, space: str, *, quota_memories: int, created_by: str) -> bool:
        """Make the space with its creator as admin; False when it exists (nothing changed)."""
        async with self.pool.acquire() as conn, conn.transaction():
            made = await conn.fetchval(
                "INSERT INTO spaces (tenant_id, space_id, quota_memories, created_by) VALUES ($1, $2, $3, $4)"
                " ON CONFLICT DO NOTHING RETURNING 1",
                tenant,
                space,
                quota_memories,
                created_by,
            )
            if made:
                await conn.execute(
                    "INSERT INTO space_grants (tenant_id, space_id, principal, role, granted_by)"
                    " VALUES ($1, $2, $3, 'admin', $3)",
                    tenant,
                    space,
                    created_by,
                )
            return bool(made)

    async def get(self, tenant: str, space: str) -> Space | None:
        row = await self.pool.fetchrow(
            "SELECT space_id, quota_memories, created_by, created_at FROM spaces WHERE tenant_id = $1 AND space_id = $2",
            tenant,
            space,
        )
        return Space(**dict(row)) if row else None

    async def visible(self, tenant: str, principal: str, *, every: bool) -> list[tuple[Space, Role | None]]:
        """The spaces a key holds a grant on (`every`: all of the tenant's, for its admin), by name,
        with the key's own grant."""
        rows = await self.pool.fetch(
            """
            SELECT s.space_id, s.quota_memories, s.created_by, s.created_at, g.role
            FROM spaces s LEFT JOIN space_grants g
              ON g.tenant_id = s.tenant_id AND g.space_id = s.space_id AND g.principal = $2
            WHERE s.tenant_id = $1 AND ($3 OR g.role IS NOT NULL)
            ORDER BY s.space_id
            """,
            tenant,
            principal,
            every,
        )
        return [(Space(r["space_id"], r["quota_memories"], r["created_by"], r["created_at"]), r["role"]) for r in rows]

    async def roles(self, tenant: str, principal: str, spaces: list[str]) -> dict[str, Role]:
        """The key's grant on each of these spaces that exists and that it holds a grant on."""
        rows = await self.pool.fetch(
            "SELECT space_id, role FROM space_grants WHERE tenant_id = $1 AND principal = $2 AND space_id = ANY($3::text[])",
            tenant,
            principal,
            spaces,
        )
        return {r["space_id"]: r["role"] for r in rows}

    async def existing(self, tenant: str, spaces: list[str]) -> set[str]:
        rows = await self.pool.fetch(
            "SELECT space_id FROM spaces WHERE tenant_id = $1 AND space_id = ANY($2::text[])", tenant, spaces
        )
        return {r["space_id"] for r in rows}

    async def grants(self, tenant: str, space: str) -> list[Grant]:
        rows = await self.pool.fetch(
            "SELECT principal, role, granted_by, granted_at FROM space_grants WHERE tenant_id = $1 AND space_id = $2"
            " ORDER BY principal",
            tenant,
            space,
        )
        return [Grant(**dict(r)) for r in rows]

    async def grant(self, tenant: str, space: str, principal: str, role: Role, *, granted_by: str) -> bool:
        """Set the principal's role on the space; False when it already had it (nothing changed)."""
        changed = await self.pool.fetchval(
            """
            INSERT INTO space_grants (tenant_id, space_id, principal, role, granted_by) VALUES ($1, $2, $3, $4, $5)
            ON CONFLICT (tenant_id, space_id, principal) DO UPDATE
                SET role = EXCLUDED.role, granted_by = EXCLUDED.granted_by, granted_at = clock_timestamp()
                WHERE space_grants.role <> EXCLUDED.role
            RETURNING 1
            """,
            tenant,
            space,
            principal,
            role,
            granted_by,
        )
        return bool(changed)

    async def revoke(self, tenant: str, space: str, principal: str) -> bool:
        status = await self.pool.execute(
            "DELETE FROM space_grants WHERE tenant_id = $1 AND space_id = $2 AND principal = $3", tenant, space, principal
        )
        return status.endswith(" 1")

    async def delete(self, tenant: str, space: str) -> bool:
        """The space and its grants (its memories and facts are removed by the caller first)."""
        status = await self.pool.execute("DELETE FROM spaces WHERE tenant_id = $1 AND space_id = $2", tenant, space)
        return status.endswith(" 1")

    async def memory_count(self, tenant: str, owner: str) -> int:
        """The memories an owner holds, from the statistics the keyword index keeps (no count(*))."""
        n = await self.pool.fetchval("SELECT n FROM memory_user_stats WHERE tenant_id = $1 AND user_id = $2", tenant, owner)
        return int(n or 0)
