"""Milvus is rebuilt from PostgreSQL: a memory whose vector Milvus lost (Milvus Lite acknowledges
writes before they are on disk) comes back with the vector the same model gives its text, and a
memory deleted meanwhile does not."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np
import pytest

from serve_app.core.records import MemoryRow
from serve_app.encoding.sentence import SentenceEncoder
from serve_app.services.index_repair import repair_vectors
from serve_app.services.memory_writes import delete_memories, save_memories
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores
from tests.contract.own_milvus import OwnMilvus


async def _stores(redis_url: str, postgres_dsn: str, milvus_uri: str) -> Stores:
    """Stores on a database of the test's own (a repair walks every user of its database) and a
    collection of its own."""
    collection = "repair_" + uuid.uuid4().hex[:8]
    settings = Settings(redis_url=redis_url, postgres_dsn=postgres_dsn, milvus_uri=milvus_uri, milvus_collection=collection)
    return await Stores.connect(settings)


class Milvus(NamedTuple):
    engine: str
    url: str
    restart: Callable[[], None] | None  # None: the session's, which no test restarts


@pytest.fixture(params=["lite", "server"])
def milvus(request, tmp_path) -> Iterator[Milvus]:
    """A Milvus Lite of the test's own, which it restarts, or the session's Milvus server."""
    if request.param == "server":
        yield Milvus("server", request.getfixturevalue("backends").env["MILVUS_URI"], None)
        return
    own = OwnMilvus(tmp_path / "milvus")
    yield Milvus("lite", own.url, own.restart)
    own.discard()


async def test_lost_vectors_come_back_and_deleted_ones_stay_gone(backends, fresh_dsn, encoder: SentenceEncoder, milvus: Milvus):
    stores = await _stores(backends.env["REDIS_URL"], fresh_dsn, milvus.url)
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

        if milvus.engine == "lite":
            # A restarted Milvus Lite has released the collection: the client loads it again at the
            # next read and counts it, so the memorizer repairs what Milvus Lite lost. (A restarted
            # server loads its collections itself and keeps what it acknowledged: test_crash_durability.)
            milvus.restart()
            await stores.vectors.fetch("t", "a", ["m1"])  # a read: the client reloads the collection
            assert await stores.milvus_reloads() > reloads
        found = await stores.vectors.fetch("t", "a", [f"m{i}" for i in range(20)])
        assert len(found) == 19
    finally:
        await stores.close()


async def test_repair_keeps_text_and_origin(backends, fresh_dsn, encoder: SentenceEncoder):
    stores = await _stores(backends.env["REDIS_URL"], fresh_dsn, backends.env["MILVUS_URI"])
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
