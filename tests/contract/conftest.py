"""A PostgreSQL database of a test's own, on the session's server."""

from __future__ import annotations

import uuid

import asyncpg
import pytest


@pytest.fixture
async def fresh_dsn(backends) -> str:
    """A database of its own on the session's PostgreSQL: a repair walks every user of its database."""
    dsn = backends.env["POSTGRES_DSN"]
    name = "fresh_" + uuid.uuid4().hex[:8]
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"CREATE DATABASE {name}")
    finally:
        await conn.close()
    return f"{dsn.rsplit('/', 1)[0]}/{name}"
