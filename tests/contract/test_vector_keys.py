"""Milvus rows keyed per owner, against real PostgreSQL and Milvus: a repair that meets a memory no
Milvus row can hold skips it and goes on with the rest."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from serve_app.core.records import MemoryRow
from serve_app.services.memories import repair_vectors, save_memories
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores


@pytest.fixture
async def fresh_dsn(backends) -> str:
    """A database of its own on the session's PostgreSQL: a repair walks every user of its database."""
    dsn = backends.env["POSTGRES_DSN"]
    name = "keys_" + uuid.uuid4().hex[:8]
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"CREATE DATABASE {name}")
    finally:
        await conn.close()
    return f"{dsn.rsplit('/', 1)[0]}/{name}"


async def test_repair_skips_a_memory_no_milvus_row_holds_and_goes_on(backends, fresh_dsn, embed):
    settings = Settings(**backends.env, postgres_dsn=fresh_dsn, milvus_collection="keys_" + uuid.uuid4().hex[:8])
    stores = await Stores.connect(settings)
    try:
        text = "Keeps the spare key under the blue pot."
        (vector,) = await embed([text])
        good = MemoryRow("kept", "t", "b-good", "s", 1, "user", "turn", text, 1_700_000_000_000, vector)
        await save_memories(stores, [good])
        await stores.vectors.delete(tenant_id="t", user_id="b-good", id="kept")  # as a crash loses it
        # A row PostgreSQL holds and no Milvus row can (written before the API bounded ids as the
        # stores do), of a user the repair meets first.
        bad = MemoryRow("x" * 300, "t", "a-bad", "s", 1, "user", "turn", "too long an id", 1_700_000_000_000, [])
        await stores.keywords.upsert([bad])

        result = await repair_vectors(stores, embed)

        assert (result.repaired, result.unstorable) == (1, 1)
        assert [h.id for h in await stores.vectors.fetch("t", "b-good", ["kept"])] == ["kept"]
    finally:
        await stores.close()
