"""An acknowledged write survives kill -9 of every backend (own servers, not the shared ones).

Redis (appendfsync always) and PostgreSQL (fsync on commit) keep what they acknowledged. Milvus Lite
does not promise that (it acknowledges before it persists), and the service does not rely on it:
PostgreSQL holds every memory, and the memorizer's repair gives Milvus back what it lost. That is
the promise tested here.
"""

import asyncio
import json
import os
import signal
import time

import pytest

from serve_app.core.records import MemoryRow
from serve_app.embedded.launchers import EmbeddedBackends, Ports
from serve_app.embedded.milvus_server import SERVER_SETTINGS, read_sessions
from serve_app.services.index_repair import repair_vectors
from serve_app.services.memory_writes import save_memories
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores
from serve_app.stores.vectors import VectorStore
from tests.contract.own_milvus import OwnMilvus

TEXTS = [f"Note {i}: the parcel P-{1000 + i} goes to locker {i % 7}." for i in range(50)]


async def _write(env, encoder):
    stores = await Stores.connect(Settings(**env, milvus_collection="durable"))
    try:
        await stores.log.append("t", "s", "u", [{"role": "user", "content": f"m{i}", "id": f"id{i}"} for i in range(50)])
        await stores.log.write_checkpoint(
            "t", "s", expected_version=0, summary="sum", covers_upto_seq=10, degraded=False, state=None
        )
        await stores.facts.put("t", "u", "k", "v1", "fact")
        await stores.facts.put("t", "u", "k", "v2", "fact")
        vectors = await encoder.encode_async(TEXTS)
        rows = [
            MemoryRow(
                id=f"r{i}",
                tenant_id="t",
                user_id="u",
                session_id="s",
                seq=i + 1,
                role="user",
                kind="turn",
                text=text,
                created_at_ms=1_700_000_000_000 + i,
                vector=vector,
            )  # fmt: skip
            for i, (text, vector) in enumerate(zip(TEXTS, vectors, strict=True))
        ]
        assert await save_memories(stores, rows) == 50  # acknowledged
    finally:
        await stores.close()


async def _read(env, encoder):
    stores = await Stores.connect(Settings(**env, milvus_collection="durable"))
    try:
        meta = await stores.log.meta("t", "s")
        history = [f.value for f in await stores.facts.history("t", "u", "k")]
        lost_in_crash = await stores.vectors.missing("t", "u", [f"r{i}" for i in range(50)])
        # Stand in for the acknowledged writes Milvus Lite may lose in a crash: without these gone the
        # repair would have nothing to prove.
        await stores.vectors.delete(tenant_id="t", user_id="u", id=[f"r{i}" for i in range(0, 50, 10)])
        repaired = (await repair_vectors(stores, encoder.encode_documents_async)).written
        ids = [f"r{i}" for i in range(50)]
        missing = await stores.vectors.missing("t", "u", ids)
        top = await stores.vectors.search_dense("t", "u", (await encoder.encode_async([TEXTS[20]]))[0], limit=1)
        return meta, history, lost_in_crash, repaired, missing, top[0].text
    finally:
        await stores.close()


@pytest.mark.parametrize("engine", ["lite", "server"])
def test_kill_minus_nine_then_restart_and_repair_finds_everything(tmp_path, encoder, engine):
    servers = EmbeddedBackends(tmp_path / "data", Ports.free(), milvus_engine=engine).start()
    try:
        asyncio.run(_write(servers.env, encoder))
        for name in ("redis", "postgres", "milvus"):
            servers.backends[name].kill()
            servers.restart(name)
        meta, history, lost_in_crash, repaired, missing, top = asyncio.run(_read(servers.env, encoder))
    finally:
        servers.backends["milvus"].kill()  # a Milvus server's own shutdown hangs out the grace of a stop
        servers.stop()
    assert meta.message_count == 50 and meta.covers_upto_seq == 10 and meta.summary == "sum"
    assert history == ["v1", "v2"]
    if engine == "server":  # its write-ahead log keeps what it acknowledged; Milvus Lite may not
        assert lost_in_crash == set()
    assert repaired >= 5 and missing == set()
    assert top == TEXTS[20]  # a repaired memory is found by its meaning: the same model, the same vector


def test_a_data_dir_started_with_the_other_engine_gets_every_vector_back(tmp_path, encoder):
    """A data dir that Milvus Lite served (the embedded default before the server) started with the
    server: its Milvus begins empty, and `repair_vectors` (which the memorizer's sweep runs once
    whenever it starts, services/sweep.py) fills it from PostgreSQL, so every memory is found by its
    meaning again."""
    lite = EmbeddedBackends(tmp_path / "data", Ports.free(), milvus_engine="lite").start()
    try:
        asyncio.run(_write(lite.env, encoder))
    finally:
        lite.stop()
    server = EmbeddedBackends(tmp_path / "data", Ports.free(), milvus_engine="server").start()
    try:

        async def switched() -> tuple[set[str], int, set[str], str]:
            stores = await Stores.connect(Settings(**server.env, milvus_collection="durable"))
            try:
                ids = [f"r{i}" for i in range(50)]
                empty = await stores.vectors.missing("t", "u", ids)
                repaired = (await repair_vectors(stores, encoder.encode_documents_async)).written
                query = (await encoder.encode_async([TEXTS[20]]))[0]
                top = await stores.vectors.search_dense("t", "u", query, limit=1)
                return empty, repaired, await stores.vectors.missing("t", "u", ids), top[0].text
            finally:
                await stores.close()

        empty, repaired, missing, top = asyncio.run(switched())
    finally:
        server.backends["milvus"].kill()
        server.stop()
    assert len(empty) == 50  # the server starts without the Lite files' vectors
    assert repaired == 50 and missing == set() and top == TEXTS[20]


@pytest.mark.parametrize("engine", ["lite", "server"])
def test_an_open_vector_store_reads_again_after_milvus_restarts(tmp_path, engine):
    """A restarted Milvus Lite has forgotten every load, a restarted server reloads on its own: the
    store reads again either way, without a new client."""
    milvus = OwnMilvus(tmp_path / "data", engine)

    async def scenario() -> tuple[int, int]:
        vectors = await asyncio.to_thread(VectorStore, milvus.url, "reopen", 4)
        try:
            await vectors.upsert(
                [MemoryRow(f"r{i}", "t", "u", "s", i, "user", "turn", "x", 0, [1, 0, 0, i / 9]) for i in range(9)]
            )
            milvus.backend.kill()
            await asyncio.to_thread(milvus.restart)
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
        milvus.discard()
    assert (found, listed) == (9, 9)


def test_a_milvus_server_stalled_for_seconds_serves_again(tmp_path):
    """A process starved of CPU for a while (a busy two-core machine) stops renewing its components'
    etcd sessions; past the session TTL they are revoked, and the server exits or answers "service
    not ready" until someone restarts it. Here it is stopped outright (SIGSTOP) for 15 s, then resumed."""
    milvus = OwnMilvus(tmp_path / "data", "server")

    async def scenario() -> int:
        vectors = await asyncio.to_thread(VectorStore, milvus.url, "stall", 4)
        try:
            rows = [MemoryRow(f"r{i}", "t", "u", "s", i, "user", "turn", "x", 0, [1, 0, 0, i / 9]) for i in range(9)]
            await vectors.upsert(rows)
            group = milvus.backend.process.pid
            os.killpg(group, signal.SIGSTOP)
            await asyncio.sleep(15)
            os.killpg(group, signal.SIGCONT)
            deadline = time.monotonic() + 30
            while True:
                try:
                    return len(await vectors.missing("t", "u", [f"r{i}" for i in range(9)]))
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.5)
        finally:
            await vectors.close()

    try:
        missing = asyncio.run(scenario())
    finally:
        milvus.discard()
    assert missing == 0


def test_a_milvus_server_started_after_kill_minus_nine_does_not_wait_out_the_dead_sessions(tmp_path):
    """The killed process's etcd sessions outlive it by their lease (`common.session.ttl`); the new
    process deletes them once it has registered its own instead of waiting them out, and serves
    every row it acknowledged before the kill."""
    milvus = OwnMilvus(tmp_path / "data", "server")
    ids = [f"r{i}" for i in range(9)]

    async def write() -> None:
        vectors = await asyncio.to_thread(VectorStore, milvus.url, "sessions", 4)
        try:
            await vectors.upsert(
                [MemoryRow(i, "t", "u", "s", n, "user", "turn", "x", 0, [1, 0, 0, n / 9]) for n, i in enumerate(ids)]
            )
        finally:
            await vectors.close()

    async def missing() -> set[str]:
        vectors = await asyncio.to_thread(VectorStore, milvus.url, "sessions", 4)
        try:
            return await vectors.missing("t", "u", ids)
        finally:
            await vectors.close()

    try:
        asyncio.run(write())
        milvus.backend.kill()
        started = time.monotonic()
        milvus.restart()
        restart_s = time.monotonic() - started
        etcd_port = json.loads((tmp_path / "data" / "milvus-server" / "ports.json").read_text())["etcd_port"]
        server_ids = {session.server_id for session in read_sessions(etcd_port)}
        lost = asyncio.run(missing())
    finally:
        milvus.discard()
    assert len(server_ids) == 1, f"sessions of more than one process: {server_ids}"
    assert restart_s < SERVER_SETTINGS["common.session.ttl"], f"the restart waited {restart_s:.1f}s"
    assert lost == set()


def _race_row(writer: int, seq: int, vector: list[float]) -> MemoryRow:
    return MemoryRow(
        id=f"{writer}-{seq}",
        tenant_id="t",
        user_id=f"u{writer}",
        session_id="s",
        seq=seq,
        role="user",
        kind="turn",
        text=f"writer {writer} note {seq}: locker L-{writer}{seq:02d}",
        created_at_ms=1_700_000_000_000 + seq,
        vector=vector,
    )


def test_writes_racing_a_reload_after_a_milvus_restart_are_kept(tmp_path, encoder):
    """Right after Milvus restarts, six writers save memories as the memorizer does (PostgreSQL and
    Milvus) while a reader's searches and the writers race the reload of the released collection.
    Every acknowledged write is in PostgreSQL, the record, and in Milvus once the repair has run:
    the store's read-back keeps most of what Milvus Lite drops around a reload, the repair the rest."""
    servers = EmbeddedBackends(tmp_path / "data", Ports.free()).start()
    writers, per_writer = 6, 40

    async def scenario() -> tuple[dict[int, set[int]], dict[int, set[int]], int]:
        stores = await Stores.connect(Settings(**servers.env, milvus_collection="race"))
        texts = {w: [_race_row(w, j, []).text for j in range(per_writer)] for w in range(writers)}
        vectors = await encoder.encode_async([t for w in texts for t in texts[w]])
        rows = {w: [_race_row(w, j, vectors[w * per_writer + j]) for j in range(per_writer)] for w in range(writers)}
        acked: dict[int, set[int]] = {w: set() for w in range(writers)}
        try:
            await save_memories(stores, [_race_row(99, 0, vectors[0])])
            servers.backends["milvus"].kill()
            await asyncio.to_thread(servers.restart, "milvus")

            async def writer(w: int) -> None:
                for i in range(0, per_writer, 2):
                    for _ in range(50):
                        try:
                            await save_memories(stores, rows[w][i : i + 2])
                            acked[w].update((i, i + 1))
                            break
                        except Exception:
                            await asyncio.sleep(0.1)

            async def reader() -> None:
                for _ in range(40):
                    try:
                        await stores.vectors.search_dense("t", "u1", vectors[0], limit=5)
                    except Exception:
                        pass
                    await asyncio.sleep(0.02)

            await asyncio.gather(*(writer(w) for w in range(writers)), reader())
            not_recorded = {
                w: acked[w] - {int(i.split("-")[1]) for i in await stores.keywords.memory_ids("t", f"u{w}")} for w in acked
            }
            await repair_vectors(stores, encoder.encode_documents_async)
            not_in_milvus = {w: acked[w] - {r["seq"] for r in await stores.vectors.list("t", f"u{w}", limit=1000)} for w in acked}
            return not_recorded, not_in_milvus, sum(len(a) for a in acked.values())
        finally:
            await stores.close()

    try:
        # Bounded: a store call that never answers fails this test instead of holding up the suite.
        not_recorded, not_in_milvus, acknowledged = asyncio.run(asyncio.wait_for(scenario(), 240))
    finally:
        servers.stop()
    assert acknowledged == writers * per_writer  # every write went through in the end
    assert not_recorded == {w: set() for w in range(writers)}
    assert not_in_milvus == {w: set() for w in range(writers)}


def test_a_milvus_that_does_not_answer_is_answered_within_the_bound(tmp_path):
    """A write or a read while Milvus does not answer (frozen, as a restarting or overloaded server
    is: connections open, no replies) fails within the store's bound, so the client gets a 503 with
    Retry-After; unbounded, the write was still waiting after a minute and the read took 30 s, as
    long as a client's whole timeout. (A dead Milvus refuses connections and fails fast anyway.)"""
    from serve_app.stores.vectors import RPC_TIMEOUT_S

    own = OwnMilvus(tmp_path / "data")
    row = _race_row(0, 1, [1, 0, 0, 0])
    milvus = own.backend.process

    async def failing_within(call) -> float:
        started = time.monotonic()
        try:
            await asyncio.wait_for(call(), 6 * RPC_TIMEOUT_S)
        except TimeoutError:
            raise AssertionError("still waiting on a Milvus that is down") from None
        except Exception:  # the store's answer: Milvus is unavailable
            return time.monotonic() - started
        raise AssertionError("a call to a Milvus that is down succeeded")

    async def scenario() -> tuple[float, float]:
        vectors = await asyncio.to_thread(VectorStore, own.url, "down", 4)
        try:
            await vectors.upsert([row])
            os.kill(milvus.pid, signal.SIGSTOP)
            write_s = await failing_within(lambda: vectors.upsert([row]))
            read_s = await failing_within(lambda: vectors.search_dense("t", "u0", [1, 0, 0, 0], limit=5))
            return write_s, read_s
        finally:
            await vectors.close()

    try:
        write_s, read_s = asyncio.run(scenario())
    finally:
        os.kill(milvus.pid, signal.SIGCONT)
        own.discard()
    assert write_s <= 2 * RPC_TIMEOUT_S and read_s <= 2 * RPC_TIMEOUT_S, (write_s, read_s)
