"""The PostgreSQL pool against a real server: no reset statement on release, yet nothing leaks from
one acquirer to the next (an open transaction is rolled back, a session lock never outlives its
holder, even when its release fails)."""

import asyncio
import uuid

import asyncpg
import pytest

from serve_app.stores.pg_pool import create_pool, session_lock


@pytest.fixture
async def pool(backends):
    created = await create_pool(backends.env["POSTGRES_DSN"], min_size=1, max_size=1)
    yield created
    await created.close()


async def test_a_released_connection_is_sent_no_reset_statement(pool, backends):
    async with pool.acquire() as conn:
        pid = await conn.fetchval("SELECT pg_backend_pid()")
    outside = await asyncpg.connect(backends.env["POSTGRES_DSN"])
    try:
        # What the backend last ran is the statement before the release: the pool sent nothing after it.
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT pg_backend_pid()") == pid  # the same connection, max_size 1
            await conn.execute("SELECT 'the last statement'")
        query = await outside.fetchval("SELECT query FROM pg_stat_activity WHERE pid = $1", pid)
        assert query == "SELECT 'the last statement'"
    finally:
        await outside.close()


async def test_a_transaction_left_open_is_rolled_back_on_release(pool):
    table = "t_" + uuid.uuid4().hex[:8]
    await pool.execute(f"CREATE TABLE {table} (x INT)")
    try:
        async with pool.acquire() as conn:
            await conn.execute("BEGIN")  # not a managed transaction: the acquirer never ends it
            await conn.execute(f"INSERT INTO {table} VALUES (1)")
        async with pool.acquire() as conn:
            assert not conn.is_in_transaction()
            assert await conn.fetchval(f"SELECT count(*) FROM {table}") == 0
    finally:
        await pool.execute(f"DROP TABLE {table}")


async def lock_is_free(dsn: str, key: str) -> bool:
    other = await asyncpg.connect(dsn)
    try:
        taken = await other.fetchval("SELECT pg_try_advisory_lock(hashtextextended($1, 0))", key)
        if taken:
            await other.execute("SELECT pg_advisory_unlock(hashtextextended($1, 0))", key)
        return taken
    finally:
        await other.close()


async def test_a_session_lock_is_held_inside_and_free_after(pool, backends):
    dsn, key = backends.env["POSTGRES_DSN"], "lock-" + uuid.uuid4().hex
    async with session_lock(pool, key):
        assert not await lock_is_free(dsn, key)
    assert await lock_is_free(dsn, key)
    with pytest.raises(RuntimeError):
        async with session_lock(pool, key):
            raise RuntimeError("the holder failed")
    assert await lock_is_free(dsn, key)


async def test_a_session_lock_whose_release_fails_takes_its_connection_down(pool, backends):
    dsn, key = backends.env["POSTGRES_DSN"], "lock-" + uuid.uuid4().hex
    with pytest.raises(asyncpg.InFailedSQLTransactionError):
        async with session_lock(pool, key) as conn:
            # A failed transaction refuses every statement, the unlock too, while the session lives
            # on: rolled back by the pool, the connection would still hold the lock.
            await conn.execute("BEGIN")
            with pytest.raises(asyncpg.DivisionByZeroError):
                await conn.execute("SELECT 1/0")
    for _ in range(50):  # the server ends the closed session, and its locks, in a moment
        if await lock_is_free(dsn, key):
            break
        await asyncio.sleep(0.1)
    assert await lock_is_free(dsn, key)
    assert await pool.fetchval("SELECT 1") == 1  # the pool opened a new connection in its place
