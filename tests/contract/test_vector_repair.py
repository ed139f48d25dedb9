"""Milvus is rebuilt from PostgreSQL: a memory whose vector Milvus lost (Milvus Lite acknowledges
writes before they are on disk) comes back with the vector the same model gives its text, and a
memory deleted meanwhile does not."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from serve_app.core.records import MemoryRow
from serve_app.embedded.launchers import EmbeddedBackends, Ports
from serve_app.encoding.sentence import SentenceEncoder
from serve_app.services.index_repair import repair_vectors
from serve_app.services.memory_writes import delete_memories, save_memories
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores


@pytest.fixture(scope="module")
def encoder() -> SentenceEncoder:
    return SentenceEncoder(threads=1, int8=Settings().embedding_int8)


async def _stores(env: dict) -> Stores:
    settings = Settings(
        redis_url=env["REDIS_URL"], postgres_dsn=env["POSTGRES_DSN"], milvus_uri=env["MILVUS_URI"], milvus_collection="repair"
    )
    return await Stores.connect(settings)


@pytest.mark.parametrize("engine", ["lite", "server"])
def test_lost_vectors_come_back_and_deleted_ones_stay_gone(tmp_path, encoder: SentenceEncoder, engine: str):
    servers = EmbeddedBackends(tmp_path / "data", Ports.free(), milvus_engine=engine).start()
    try:
        asyncio.run(_scenario(servers, encoder, engine))
    finally:
        servers.stop()


async def _scenario(servers: EmbeddedBackends, encoder: SentenceEncoder, engine: str) -> None:
    stores = await _stores(servers.env)
    try:
        texts = [f"user a said thing number {i} about the trip to Lisbon" for i in range(30)]
        rows = [
            MemoryRow(f"m{i}", "t", "a" if i < 20 else "b", "s1", i, "user", "turn", t, 1_700_000_000_000 + i, v)
            for i, (t, v) in enumerate(zip(texts, encoder.encode(texts), strict=True))
        ]
        await save_memories(stores, rows)
        reloads = await stores.milvus_reloads()
        assert (await repair_vectors(stores, encoder.encode_documents_async)).written == 0  # nothing to do

        # Milvus loses some rows: taken out of Milvus only, as a crash would.
        await stores.vectors.delete(tenant_id="t", id=["m3", "m7", "m25"])
        assert await stores.vectors.missing("t", "a", ["m3", "m7", "m8"]) == {"m3", "m7"}
        # One of the lost memories is deleted by its user before the repair runs.
        await delete_memories(stores, "t", memory_id="m7")

        assert (await repair_vectors(stores, encoder.encode_documents_async)).written == 2
        assert await stores.vectors.missing("t", "a", [f"m{i}" for i in range(20) if i != 7]) == set()
        assert await stores.vectors.missing("t", "b", ["m25"]) == set()
        assert [h.id for h in await stores.vectors.fetch("t", "a", ["m7"])] == []
        # The repaired vector is the one the model gives the text: recall finds it first.
        top = await stores.vectors.search_dense_ids("t", "a", encoder.encode([texts[3]])[0], limit=1)
        assert top[0][0] == "m3" and top[0][1] == pytest.approx(1.0, abs=1e-3)

        if engine == "lite":
            # A restarted Milvus Lite has released the collection: the client loads it again at the
            # next read and counts it, so the memorizer repairs what Milvus Lite lost. (A restarted
            # server loads its collections itself and keeps what it acknowledged: test_crash_durability.)
            servers.backends["milvus"].stop()
            servers.restart("milvus")
            await stores.vectors.fetch("t", "a", ["m1"])  # a read: the client reloads the collection
            assert await stores.milvus_reloads() > reloads
        found = await stores.vectors.fetch("t", "a", [f"m{i}" for i in range(20)])
        assert len(found) == 19
    finally:
        await stores.close()


def test_repair_keeps_text_and_origin(tmp_path, encoder: SentenceEncoder):
    servers = EmbeddedBackends(tmp_path / "data", Ports.free()).start()
    try:

        async def run() -> None:
            stores = await _stores(servers.env)
            try:
                row = MemoryRow("x1", "t", "u", "sess", 5, "assistant", "turn", "Ticket T-9 is open", 1_700_000_123_000, [])
                row.vector = encoder.encode([row.text])[0]
                await save_memories(stores, [row])
                await stores.vectors.delete(tenant_id="t", id="x1")
                assert (await repair_vectors(stores, encoder.encode_documents_async)).written == 1
                (hit,) = await stores.vectors.fetch("t", "u", ["x1"])
                assert (hit.text, hit.session_id, hit.seq, hit.role, hit.kind, hit.created_at_ms) == (
                    row.text,
                    "sess",
                    5,
                    "assistant",
                    "turn",
                    row.created_at_ms,
                )
                got = np.array((await stores.vectors.search_dense_ids("t", "u", row.vector, limit=1))[0][1])
                assert float(got) == pytest.approx(1.0, abs=1e-3)
            finally:
                await stores.close()

        asyncio.run(run())
    finally:
        servers.stop()
