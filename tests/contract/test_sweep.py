"""The memorizer's schedule against real stores: embedding never waits for the LLM."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from serve_app.services.sweep import MemorizerSweep
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores
from tests.doubles import ScriptedChatClient

TENANT = "sweep-" + uuid.uuid4().hex[:6]


@pytest.fixture
async def stores(backends, redis_settings):
    connected = await Stores.connect(Settings(**(backends.env | redis_settings), milvus_collection="sweep"))
    yield connected
    await connected.close()


async def _passes(sweep: MemorizerSweep, count: int) -> None:
    for _ in range(count):
        await sweep.sweep()
        await asyncio.gather(*list(sweep.running.values()))
        await asyncio.sleep(0.06)


async def test_an_llm_outage_never_stops_embedding(stores, embed):
    """More sessions owe extraction than one sweep reads, and the LLM is down: a new session's turns
    are still embedded and searchable within a few sweeps."""
    llm = ScriptedChatClient(lambda call: '{"facts": []}')
    llm.down = True
    settings = Settings(milvus_collection="sweep", memorizer_sweep_interval_s=0.05, compaction_trigger_tokens=100_000)
    sweep = MemorizerSweep(stores, embed, settings, llm, pending_limit=8)
    user = "u-" + uuid.uuid4().hex[:6]
    for i in range(12):
        await stores.log.append(TENANT, f"owed-{i}", user, [{"role": "user", "content": f"I keep ticket T-{i} open."}])
    await _passes(sweep, 6)  # the LLM stays down: every one of them owes extraction

    await stores.log.append(TENANT, "fresh", user, [{"role": "user", "content": "A purple submarine docked in Lisbon."}])
    await _passes(sweep, 6)

    assert (await stores.log.meta(TENANT, "fresh")).memorized_upto_seq == 1
    hits = await stores.vectors.search_dense(TENANT, user, (await embed(["submarine"]))[0], limit=1)
    assert hits and hits[0].session_id == "fresh"
    for i in range(12):
        assert (await stores.log.meta(TENANT, f"owed-{i}")).memorized_upto_seq == 1, i
        assert (await stores.log.meta(TENANT, f"owed-{i}")).extracted_upto_seq == 0, i  # still owed, never skipped


async def test_every_acknowledged_append_is_memorized_while_the_sweep_runs(stores, embed):
    """Writers append to sessions of many lane shards while sweeps run: once the writers stop, a few
    sweeps memorize every acknowledged turn (on a cluster, the lanes live on all three masters)."""
    settings = Settings(milvus_collection="sweep", memorizer_sweep_interval_s=0.05, compaction_trigger_tokens=100_000)
    sweep = MemorizerSweep(stores, embed, settings, None)
    user = "race-" + uuid.uuid4().hex[:6]
    acknowledged: dict[str, int] = {}

    async def writer(w: int) -> None:
        for i in range(6):
            session = f"{user}-{w}"
            turn = {"role": "user", "content": f"note {w}.{i}", "id": f"{w}.{i}"}
            result = await stores.log.append(TENANT, session, user, [turn])
            acknowledged[session] = max(acknowledged.get(session, 0), result.seqs[-1])
            await asyncio.sleep(0.01)

    async def sweeping(stop: asyncio.Event) -> None:
        while not stop.is_set():
            await _passes(sweep, 1)

    stop = asyncio.Event()
    sweeper = asyncio.create_task(sweeping(stop))
    await asyncio.gather(*(writer(w) for w in range(16)))
    stop.set()
    await sweeper
    await _passes(sweep, 8)
    shards = {stores.log._lanes(TENANT, session)[0] for session in acknowledged}
    assert len(shards) > 4
    if stores.log.cluster:
        assert len({stores.log.redis.get_node_from_key(key).name for key in shards}) > 1
    for session, upto in acknowledged.items():
        assert upto == 6 and (await stores.log.meta(TENANT, session)).memorized_upto_seq == 6, session
        assert (TENANT, session) not in await stores.log.pending(limit=100_000)
    assert len(await stores.vectors.list(TENANT, user, limit=200)) == 16 * 6
