"""An acknowledged write survives kill -9 of every backend (own servers, not the shared ones)."""

import asyncio

from serve_app.embedded.launchers import EmbeddedBackends, Ports
from serve_app.stores.facts import FactStore
from serve_app.stores.session_log import SessionLog
from serve_app.stores.vectors import MemoryRow, VectorStore


async def _write(env):
    log = SessionLog(env["REDIS_URL"], 3600)
    await log.append("t", "s", "u", [{"role": "user", "content": f"m{i}", "id": f"id{i}"} for i in range(50)])
    await log.write_checkpoint("t", "s", expected_version=0, summary="sum", covers_upto_seq=10, degraded=False, state=None)
    facts = await FactStore.connect(env["POSTGRES_DSN"])
    await facts.put("t", "u", "k", "v1", "fact")
    await facts.put("t", "u", "k", "v2", "fact")
    vectors = await asyncio.to_thread(VectorStore, env["MILVUS_URI"], "durable", 4)
    await vectors.upsert([MemoryRow(f"r{i}", "t", "u", "s", i, "user", "turn", "x", 0, [1, 0, 0, i / 50]) for i in range(50)])
    await asyncio.gather(log.close(), facts.close(), vectors.close())


async def _read(env):
    log = SessionLog(env["REDIS_URL"], 3600)
    facts = await FactStore.connect(env["POSTGRES_DSN"])
    vectors = await asyncio.to_thread(VectorStore, env["MILVUS_URI"], "durable", 4)
    try:
        meta = await log.meta("t", "s")
        history = [f.value for f in await facts.history("t", "u", "k")]
        count = await vectors.count_session("t", "s")
        return meta, history, count
    finally:
        await asyncio.gather(log.close(), facts.close(), vectors.close())


def test_kill_minus_nine_then_restart_finds_everything(tmp_path):
    servers = EmbeddedBackends(tmp_path / "data", Ports.free()).start()
    try:
        asyncio.run(_write(servers.env))
        for name in ("redis", "postgres", "milvus"):
            servers.backends[name].kill()
            servers.restart(name)
        meta, history, count = asyncio.run(_read(servers.env))
    finally:
        servers.stop()
    assert meta.message_count == 50 and meta.covers_upto_seq == 10 and meta.summary == "sum"
    assert history == ["v1", "v2"]
    assert count == 50
