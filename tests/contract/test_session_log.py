"""Session log contract against a real Redis server, and against a real three-master Redis Cluster."""

import asyncio
import time
import uuid

import pytest

from serve_app.errors import SessionOwnerError
from serve_app.stores.session_log import SessionLog


@pytest.fixture
async def log(redis_settings):
    store = SessionLog(redis_settings["REDIS_URL"], ttl_s=3600, cluster=redis_settings["redis_cluster"])
    yield store
    await store.close()


def _sid() -> str:
    return "s-" + uuid.uuid4().hex[:8]


async def test_seqs_are_gapless_and_ids_idempotent(log):
    sid = _sid()
    first = await log.append("t", sid, "u", [{"role": "user", "content": "a", "id": "m1"}, {"role": "assistant", "content": "b"}])
    assert first.seqs == [1, 2] and first.duplicates == [False, False]
    again = await log.append(
        "t", sid, "u", [{"role": "user", "content": "a", "id": "m1"}, {"role": "user", "content": "c", "id": "m2"}]
    )
    assert again.seqs == [1, 3] and again.duplicates == [True, False]
    rows = await log.read("t", sid)
    assert [r["seq"] for r in rows] == [1, 2, 3]
    assert [r["content"] for r in rows] == ["a", "b", "c"]
    page = await log.read("t", sid, after=1, limit=1)
    assert [r["seq"] for r in page] == [2]


async def test_another_user_is_refused(log):
    sid = _sid()
    await log.append("t", sid, "alice", [{"role": "user", "content": "x"}])
    with pytest.raises(SessionOwnerError):
        await log.append("t", sid, "mallory", [{"role": "user", "content": "y"}])
    assert len(await log.read("t", sid)) == 1


async def test_tenants_are_separate(log):
    sid = _sid()
    await log.append("t1", sid, "alice", [{"role": "user", "content": "x"}])
    assert await log.meta("t2", sid) is None
    await log.append("t2", sid, "bob", [{"role": "user", "content": "y"}])
    assert (await log.read("t1", sid))[0]["content"] == "x"


async def test_ttl_is_set_and_refreshed(log):
    sid = _sid()
    await log.append("t", sid, "u", [{"role": "user", "content": "x"}])
    meta_key, log_key, _ = log._keys("t", sid)
    await log.redis.expire(log_key, 10)
    await log.append("t", sid, "u", [{"role": "user", "content": "y"}])
    assert 3500 < await log.redis.ttl(log_key) <= 3600
    assert 3500 < await log.redis.ttl(meta_key) <= 3600
    assert 3500 < await log.redis.ttl(log._user_index("t", "u", sid)) <= 3600


async def test_concurrent_appends_lose_nothing(log):
    sid = _sid()

    async def writer(w: int):
        for i in range(50):
            await log.append("t", sid, "u", [{"role": "user", "content": f"{w}:{i}", "id": f"w{w}-{i}"}])
            if i % 10 == 0:  # a retry of an acknowledged write
                await log.append("t", sid, "u", [{"role": "user", "content": f"{w}:{i}", "id": f"w{w}-{i}"}])

    await asyncio.gather(*(writer(w) for w in range(10)))
    rows = await log.read("t", sid)
    assert [r["seq"] for r in rows] == list(range(1, 501))
    contents = [r["content"] for r in rows]
    assert len(set(contents)) == 500
    for w in range(10):
        mine = [int(c.split(":")[1]) for c in contents if c.startswith(f"{w}:")]
        assert mine == list(range(50))


async def test_checkpoint_compare_and_set(log):
    sid = _sid()
    await log.append("t", sid, "u", [{"role": "user", "content": str(i)} for i in range(6)])
    v1 = await log.write_checkpoint("t", sid, expected_version=0, summary="s1", covers_upto_seq=3, degraded=False, state=None)
    assert v1 == 1
    stale = await log.write_checkpoint(
        "t", sid, expected_version=0, summary="late", covers_upto_seq=4, degraded=False, state=None
    )
    assert stale is None
    beyond = await log.write_checkpoint("t", sid, expected_version=1, summary="x", covers_upto_seq=99, degraded=False, state=None)
    assert beyond is None
    meta = await log.meta("t", sid)
    assert (meta.summary, meta.covers_upto_seq, meta.version) == ("s1", 3, 1)
    assert meta.message_count == 6  # compaction never deletes


async def test_the_uncovered_turns_are_those_past_the_summary_read_with_the_meta_at_once(log):
    sid = _sid()
    assert await log.uncovered("t", sid) == (None, [])
    await log.append("t", sid, "u", [{"role": "user", "content": str(i)} for i in range(6)])
    meta, turns = await log.uncovered("t", sid)
    assert meta == await log.meta("t", sid) and [t["seq"] for t in turns] == [1, 2, 3, 4, 5, 6]
    await log.write_checkpoint("t", sid, expected_version=0, summary="s1", covers_upto_seq=3, degraded=False, state=None)
    meta, turns = await log.uncovered("t", sid)
    assert (meta.summary, meta.covers_upto_seq, meta.message_count) == ("s1", 3, 6)
    assert turns == await log.read("t", sid, after=3)
    for upto in range(0, 8):  # a chat call's view: the log as it stood at seq `upto`
        _, upto_turns = await log.uncovered("t", sid, upto=upto)
        assert [t["content"] for t in upto_turns] == [str(i) for i in range(3, min(upto, 6))]


async def test_cursor_and_pending(log):
    sid = _sid()
    await log.append("t", sid, "u", [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    lane = log._lanes("t", sid)[0]
    assert await log.redis.zscore(lane, log.pending_member("t", sid)) is not None
    assert await log.advance_cursor("t", sid, 1, done=True) == 1
    assert await log.redis.zscore(lane, log.pending_member("t", sid)) is not None  # still behind
    assert await log.advance_cursor("t", sid, 2, done=True) == 2
    assert await log.redis.zscore(lane, log.pending_member("t", sid)) is None
    assert await log.advance_cursor("t", sid, 1, done=True) == 2  # never moves back


async def test_the_llm_lane_holds_a_session_until_a_pass_over_everything_succeeds(log):
    sid = _sid()
    member = ("t", sid)
    await log.append("t", sid, "u", [{"role": "user", "content": "a"}])
    await log.advance_cursor("t", sid, 1, done=True, owes_llm=True)
    assert member not in await log.pending(limit=10_000) and member in await log.llm_due(limit=10_000)

    assert await log.llm_pass_done("t", sid, seen_len=1, ok=False, retry_ms=60_000) == 60_000
    assert member not in await log.llm_due(limit=10_000) and member in await log.llm_pending(limit=10_000)  # backing off
    assert await log.llm_pass_done("t", sid, seen_len=1, ok=False, retry_ms=20_000) == 40_000  # doubled per failure

    await log.append("t", sid, "u", [{"role": "user", "content": "b"}])  # arrives while the next pass runs
    await log.llm_pass_done("t", sid, seen_len=1, ok=True, retry_ms=1000)
    assert member in await log.llm_due(limit=10_000)  # due again at once: the pass did not see "b"
    await log.llm_pass_done("t", sid, seen_len=2, ok=True, retry_ms=1000)
    assert member not in await log.llm_pending(limit=10_000)


async def test_delete_removes_everything(log):
    sid = _sid()
    await log.append("t", sid, "u", [{"role": "user", "content": "a", "id": "x"}])
    assert await log.delete("t", sid)
    assert await log.meta("t", sid) is None
    assert await log.read("t", sid) == []
    assert sid not in [s for s, _ in await log.user_sessions("t", "u")]


async def test_a_tenants_lanes_and_counters_are_its_own_however_long_the_shared_lanes(log):
    tenant, other = f"lanes-{uuid.uuid4().hex[:6]}", f"busy-{uuid.uuid4().hex[:6]}"
    # Another tenant's older backlog ahead of this one's in the shared lane.
    for i in range(30):
        await log.append(other, f"s{i}", "u", [{"role": "user", "content": "x"}])
    assert await log.tenant_lanes(tenant) == (0, None, 0)
    before = int(time.time() * 1000)
    await log.append(tenant, "a", "u", [{"role": "user", "content": "x"}])
    await log.append(tenant, "b", "u", [{"role": "user", "content": "y"}])
    pending, oldest_ms, llm_due = await log.tenant_lanes(tenant)
    assert pending == 2 and oldest_ms is not None and before - 1000 <= oldest_ms <= before + 5000 and llm_due == 0
    assert (await log.tenant_lanes(other))[0] == 30
    await log.count(tenant, {"summary_fallbacks": 2, "extraction_failures": 0})
    await log.count(tenant, {"summary_fallbacks": 1, "extraction_failures": 1})
    assert await log.counters(tenant) == {"summary_fallbacks": 3, "extraction_failures": 1}
    assert await log.counters(other) == {}


async def test_a_sessions_keys_and_lane_entries_share_one_slot(log):
    """What a Redis Cluster requires of every script and transaction here."""
    from redis.crc import key_slot

    for sid in (_sid() for _ in range(20)):
        keys = [*log._keys("t", sid), *log._lanes("t", sid), log._lease_key("t", sid, "embedding")]
        keys.append(log._user_index("t", "u", sid))
        assert len({key_slot(k.encode()) for k in keys}) == 1, keys


async def test_the_lanes_give_the_longest_waiting_first_across_their_shards(log):
    tenant = f"order-{uuid.uuid4().hex[:6]}"
    sessions = [f"s{i}" for i in range(12)]
    for sid in sessions:
        await log.append(tenant, sid, "u", [{"role": "user", "content": sid}])
        await asyncio.sleep(0.003)  # distinct arrival times
    shards = {log._lanes(tenant, sid)[0] for sid in sessions}
    assert len(shards) > 1  # the order below is a merge, not one zset's
    mine = [s for t, s in await log.pending(limit=100_000) if t == tenant]
    assert mine == sessions
    sizes = await log.lane_sizes()
    assert sizes[0] >= len(sessions)
    if log.cluster:  # the shards of this test are on more than one master
        assert len({log.redis.get_node_from_key(key).name for key in shards}) > 1


async def test_layout_one_keys_are_moved_and_read_as_before(backends):
    """Sessions stored by the layout before lane shards (one hash tag per session, one zset per lane)
    are moved when a store connects: log, ids, checkpoint, TTL and both lanes; a second run moves nothing."""
    from serve_app.stores.session_log import LAYOUT_KEY

    log = SessionLog(backends.env["REDIS_URL"], ttl_s=3600)
    tenant, waiting, owing = f"old-{uuid.uuid4().hex[:6]}", "s-waiting", "s-owing"
    try:
        for sid, memorized in ((waiting, 0), (owing, 2)):
            old = f"ms:{{{tenant}/{sid}}}"
            await log.redis.hset(
                f"{old}:meta",
                mapping={"user_id": "u", "created_at": 1, "updated_at": 2, "covers_upto_seq": 0, "version": 0,
                         "memorized_upto_seq": memorized, "extracted_upto_seq": 0, "summary": "kept"},
            )  # fmt: skip
            await log.redis.rpush(f"{old}:log", '{"role":"user","content":"a","id":"m1"}', '{"role":"user","content":"b"}')
            await log.redis.hset(f"{old}:ids", "m1", 1)
            for key in ("meta", "log", "ids"):
                await log.redis.expire(f"{old}:{key}", 1800)
            await log.redis.zadd(f"ms:{{{tenant}/u/u}}:sessions", {sid: 2})
        await log.redis.zadd("ms:pending", {f"{tenant}/{waiting}": 1000})
        await log.redis.zadd("ms:pending:llm", {f"{tenant}/{owing}": 1000})
        await log.redis.delete(LAYOUT_KEY)

        assert await log.migrate_layout() == 2
        assert await log.migrate_layout() == 0
        meta = await log.meta(tenant, waiting)
        assert (meta.user_id, meta.message_count, meta.summary) == ("u", 2, "kept")
        assert [r["content"] for r in await log.read(tenant, waiting)] == ["a", "b"]
        assert 1700 < await log.redis.ttl(log._keys(tenant, waiting)[1]) <= 1800
        assert (tenant, waiting) in await log.pending(limit=100_000)
        assert (tenant, owing) in await log.llm_due(limit=100_000)
        assert await log.pending_since_ms(tenant, waiting) == 1000
        assert sorted(s for s, _ in await log.user_sessions(tenant, "u")) == [owing, waiting]
        resent = [{"role": "user", "content": "a", "id": "m1"}, {"role": "user", "content": "c"}]
        again = await log.append(tenant, waiting, "u", resent)
        assert again.seqs == [1, 3] and again.duplicates == [True, False]
        assert not [k async for k in log.redis.scan_iter(match=f"ms:{{{tenant}/s-*")]
        assert await log.redis.zscore("ms:pending", f"{tenant}/{waiting}") is None
        assert not await log.redis.exists(f"ms:{{{tenant}/u/u}}:sessions")  # the old index, emptied
    finally:
        await log.redis.set(LAYOUT_KEY, "2")
        await log.close()
