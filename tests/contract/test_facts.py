"""Facts contract against a real PostgreSQL server."""

import asyncio
import uuid

import asyncpg
import pytest

from serve_app.core.records import FACT_CATEGORIES
from serve_app.stores.facts import FactStore, migrate
from serve_app.stores.pg_schema import MIGRATIONS


@pytest.fixture
async def facts(backends):
    store = await FactStore.connect(backends.env["POSTGRES_DSN"])
    yield store
    await store.close()


async def test_migrations_apply_once_each_in_order(facts):
    latest = MIGRATIONS[-1][0]
    assert await migrate(facts.pool) == latest
    recorded = "SELECT version, applied_at FROM schema_migrations ORDER BY version"
    applied = [tuple(r) for r in await facts.pool.fetch(recorded)]
    assert [version for version, _ in applied] == [version for version, _ in MIGRATIONS]
    assert await migrate(facts.pool) == latest
    assert [tuple(r) for r in await facts.pool.fetch(recorded)] == applied  # nothing applied twice
    columns = "SELECT column_name FROM information_schema.columns WHERE table_name = 'memory_keywords'"
    assert {"analysis", "context"} <= {r["column_name"] for r in await facts.pool.fetch(columns)}
    facts_columns = "SELECT column_name FROM information_schema.columns WHERE table_name = 'facts'"
    assert "said_at" in {r["column_name"] for r in await facts.pool.fetch(facts_columns)}  # the latest is in


async def test_update_supersedes_and_keeps_history(facts):
    user = "u-" + uuid.uuid4().hex[:6]
    _, changed = await facts.put("t", user, "language", "Python", "preference", source_session="s1", source_seqs=[3])
    assert changed
    _, changed = await facts.put("t", user, "language", "Python", "preference")
    assert not changed  # same value: no new row
    await facts.put("t", user, "language", "Go", "preference", source_seqs=[9])
    assert (await facts.get("t", user, "language")).value == "Go"
    history = await facts.history("t", user, "language")
    assert [f.value for f in history] == ["Python", "Go"]
    assert history[0].valid_to is not None and history[1].valid_to is None
    assert history[0].source_seqs == [3]


async def test_delete_closes_without_erasing(facts):
    user = "u-" + uuid.uuid4().hex[:6]
    await facts.put("t", user, "city", "Lyon", "fact")
    assert await facts.delete("t", user, "city")
    assert await facts.get("t", user, "city") is None
    assert [f.value for f in await facts.history("t", user, "city")] == ["Lyon"]
    assert not await facts.delete("t", user, "city")


async def test_concurrent_writers_leave_one_current_row(facts):
    user = "u-" + uuid.uuid4().hex[:6]
    await asyncio.gather(*(facts.put("t", user, "k", f"v{i}", "fact") for i in range(20)))
    current = [f for f in await facts.history("t", user, "k") if f.valid_to is None]
    assert len(current) == 1
    assert len(await facts.history("t", user, "k")) == 20


async def test_tenants_and_users_are_separate(facts):
    await facts.put("t1", "same", "k", "one", "fact")
    await facts.put("t2", "same", "k", "two", "fact")
    assert (await facts.get("t1", "same", "k")).value == "one"
    assert (await facts.get("t2", "same", "k")).value == "two"


async def test_bad_category_is_rejected(facts):
    with pytest.raises(ValueError):
        await facts.put("t", "u", "k", "v", "gossip")


async def test_the_database_accepts_exactly_the_fact_categories(facts):
    """The SQL CHECK (migration 1, widened by 9) and `FACT_CATEGORIES` are one list: a drift fails here."""
    insert = "INSERT INTO facts (tenant_id, user_id, key, value, category) VALUES ('t', 'u-cat', 'k', 'v', $1)"
    async with facts.pool.acquire() as conn:
        for category in FACT_CATEGORIES:
            tx = conn.transaction()
            await tx.start()
            await conn.execute(insert, category)
            await tx.rollback()
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute(insert, "gossip")
