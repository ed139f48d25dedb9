"""Memories embedded under an older document embedding are embedded again from PostgreSQL alone,
against real PostgreSQL and Milvus Lite: resumable by chunks, stamped once written, nothing deleted
brought back, and memories written meanwhile (already current) left as they are."""

import uuid

import numpy as np
import pytest

from serve_app.core.records import MemoryRow
from serve_app.encoding import DOCUMENT_EMBEDDING
from serve_app.services.index_repair import reembed_vectors
from serve_app.services.memory_writes import delete_memories, save_memories
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores

TEXTS = [
    "Hey Caroline! I signed up for a pottery class yesterday. It's like therapy for me.",
    "We went camping with the kids two weekends ago. They loved roasting marshmallows.",
    "Thanks!",
    "My sister visited from Lisbon. She brought pastries and we walked by the river.",
    "The vet said Rex needs his second vaccine in March. We booked it for the 14th.",
]


@pytest.fixture
async def world(backends):
    settings = Settings(**backends.env, milvus_collection="reembed_" + uuid.uuid4().hex[:8])
    stores = await Stores.connect(settings)
    yield stores
    await stores.close()


async def stamps(stores: Stores, user: str) -> dict[str, int]:
    rows = await stores.keywords.pool.fetch(
        "SELECT memory_id, embedding FROM memory_keywords WHERE tenant_id = 't' AND user_id = $1", user
    )
    return {r["memory_id"]: r["embedding"] for r in rows}


async def test_older_vectors_are_embedded_again_once(world, encoder, embed):
    stores = world
    user = "u-" + uuid.uuid4().hex[:6]
    whole = await encoder.encode_async(TEXTS)  # the embedding before: each whole text alone
    rows = [
        MemoryRow(f"{user}-{i}", "t", user, "s1", i + 1, "user", "turn", text, 1_700_000_000_000 + i, whole[i])
        for i, text in enumerate(TEXTS)
    ]
    await save_memories(stores, rows)
    # As rows written before the document embedding changed carry them: the older stamp.
    await stores.keywords.pool.execute("UPDATE memory_keywords SET embedding = 1 WHERE tenant_id = 't' AND user_id = $1", user)
    await delete_memories(stores, "t", memory_id=f"{user}-4")  # deleted before the pass: stays gone
    note = "A note written meanwhile. It is current already."
    (current,) = await embed([note])
    await save_memories(stores, [MemoryRow(f"{user}-new", "t", user, "s2", 1, "user", "turn", note, 1_700_000_100_000, current)])

    assert (await reembed_vectors(stores, embed, chunk=2, max_chunks=1)).written == 2  # one chunk, then stop: resumable
    marked = await stamps(stores, user)
    assert sorted(v for k, v in marked.items() if k != f"{user}-new") == [1, 1, DOCUMENT_EMBEDDING, DOCUMENT_EMBEDDING]
    assert (await reembed_vectors(stores, embed, chunk=2)).written == 2  # the rest
    assert set((await stamps(stores, user)).values()) == {DOCUMENT_EMBEDDING}
    assert (await reembed_vectors(stores, embed)).written == 0  # nothing left

    await stores.vectors.flush()
    # The stored vectors are the document embedding's, chunk by chunk as the pass embedded them
    # (int8 activations are scaled per batch), not the whole texts' alone.
    expected = [*(await embed(TEXTS[0:2])), *(await embed(TEXTS[2:4]))]
    for i, vector in enumerate(expected):
        (top,) = await stores.vectors.search_dense_ids("t", user, vector, limit=1)
        assert top[0] == f"{user}-{i}" and top[1] == pytest.approx(1.0, abs=1e-3)
    assert float(np.array(expected[0]) @ np.array(whole[0])) < 0.99  # several sentences: another vector
    assert await stores.vectors.fetch("t", user, [f"{user}-4"]) == []
