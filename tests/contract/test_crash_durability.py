"""An acknowledged write survives kill -9 of every backend (own servers, not the shared ones)."""

import asyncio

from serve_app.core.records import MemoryRow
from serve_app.embedded.launchers import EmbeddedBackends, Ports
from serve_app.stores.facts import FactStore
from serve_app.stores.session_log import SessionLog
from serve_app.stores.vectors import VectorStore


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


def test_an_open_vector_store_reads_again_after_milvus_restarts(tmp_path):
    """A restarted Milvus Lite has forgotten every load: the store loads again on its own."""
    servers = EmbeddedBackends(tmp_path / "data", Ports.free()).start()

    async def scenario() -> tuple[int, int]:
        vectors = await asyncio.to_thread(VectorStore, servers.env["MILVUS_URI"], "reopen", 4)
        try:
            await vectors.upsert(
                [MemoryRow(f"r{i}", "t", "u", "s", i, "user", "turn", "x", 0, [1, 0, 0, i / 9]) for i in range(9)]
            )
            servers.backends["milvus"].kill()
            await asyncio.to_thread(servers.restart, "milvus")
            for _ in range(50):  # the client reconnects on its own; early calls may still see the restart
                try:
                    hits = await vectors.search_dense("t", "u", [1, 0, 0, 0], limit=20)
                    break
                except Exception:
                    await asyncio.sleep(0.2)
            return len(hits), len(await vectors.list("t", "u", limit=100))
        finally:
            await vectors.close()

    try:
        found, listed = asyncio.run(scenario())
    finally:
        servers.stop()
    assert (found, listed) == (9, 9)


def test_upserts_racing_a_reload_after_a_milvus_restart_are_kept(tmp_path):
    """Milvus Lite acknowledges upserts into the released collection of a restarted server and drops
    them when a load runs meanwhile: the store loads first and reads its writes back."""
    servers = EmbeddedBackends(tmp_path / "data", Ports.free()).start()

    async def scenario() -> dict[int, set[int]]:
        vectors = await asyncio.to_thread(VectorStore, servers.env["MILVUS_URI"], "race", 4)
        acked: dict[int, set[int]] = {w: set() for w in range(6)}
        try:
            await vectors.upsert([MemoryRow("seed", "t", "u0", "s", 0, "user", "turn", "x", 0, [1, 0, 0, 0])])
            servers.backends["milvus"].kill()
            await asyncio.to_thread(servers.restart, "milvus")

            async def writer(w: int) -> None:
                for i in range(0, 40, 2):
                    rows = [MemoryRow(f"{w}-{j}", "t", f"u{w}", "s", j, "user", "turn", "x", 0, [1, j, 0, w]) for j in (i, i + 1)]
                    for _ in range(50):
                        try:
                            await vectors.upsert(rows)
                            acked[w].update((i, i + 1))
                            break
                        except Exception:
                            await asyncio.sleep(0.1)

            async def reader() -> None:
                for _ in range(40):
                    try:
                        await vectors.search_dense("t", "u1", [1, 0, 0, 0], limit=5)
                    except Exception:
                        pass
                    await asyncio.sleep(0.02)

            await asyncio.gather(*(writer(w) for w in range(6)), reader())
            return {w: acked[w] - {r["seq"] for r in await vectors.list("t", f"u{w}", limit=100)} for w in acked}
        finally:
            await vectors.close()

    try:
        lost = asyncio.run(scenario())
    finally:
        servers.stop()
    assert lost == {w: set() for w in range(6)}
