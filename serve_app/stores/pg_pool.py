"""The service's PostgreSQL connection pool, and the one way it holds a session-level lock.

asyncpg resets every connection it takes back (advisory locks, cursors, LISTEN, settings) with one
more statement, a round trip on every query a request makes. The service leaves no session state on
a pooled connection: its statements set nothing, listen to nothing, open cursors only inside
transactions, and the only session locks are taken through `session_lock` below. So the pool only
rolls back a transaction left open (asyncpg does that whatever the reset) and sends nothing else.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg


async def _nothing_to_reset(connection: asyncpg.Connection) -> None:
    """asyncpg has already rolled back an open transaction and dropped listeners by now."""


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 8) -> asyncpg.Pool:
    # JIT compiles plans for seconds on a cold start; these statements are short OLTP ones.
    return await asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        command_timeout=10,
        server_settings={"jit": "off"},
        reset=_nothing_to_reset,
    )


@asynccontextmanager
async def session_lock(pool: asyncpg.Pool, key: int | str) -> AsyncIterator[asyncpg.Connection]:
    """Hold a session-level advisory lock on one pooled connection (an integer key as it is, a text
    key hashed by the server). The pool does not reset connections, so a lock whose release cannot
    be confirmed takes its connection down with it: the server frees a closed session's locks."""
    argument = "$1::bigint" if isinstance(key, int) else "hashtextextended($1, 0)"
    async with pool.acquire() as conn:
        await conn.execute(f"SELECT pg_advisory_lock({argument})", key)
        try:
            yield conn
        finally:
            try:
                await conn.execute(f"SELECT pg_advisory_unlock({argument})", key)
            except BaseException:
                conn.terminate()
                raise
