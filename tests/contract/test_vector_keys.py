"""Milvus rows keyed per owner, against real PostgreSQL and Milvus: the vectors of the older key
scheme move over (resumably, on both engines), and a repair that meets a memory no Milvus row can
hold skips it and goes on with the rest."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from pymilvus import DataType, MilvusClient

from serve_app.core.ids import VECTOR_KEYS
from serve_app.core.records import MemoryRow
from serve_app.services.index_repair import VectorPass, move_vectors, repair_vectors
from serve_app.services.memory_writes import delete_memories, save_memories
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores
from serve_app.stores.vectors import GRPC_OPTIONS, VectorStore, milvus_record, partition_of

LEGACY_PARTITIONS = 4


async def test_repair_skips_a_memory_no_milvus_row_holds_and_goes_on(backends, fresh_dsn, embed):
    settings = Settings(**{**backends.env, "POSTGRES_DSN": fresh_dsn}, milvus_collection="keys_" + uuid.uuid4().hex[:8])
    stores = await Stores.connect(settings)
    try:
        text = "Keeps the spare key under the blue pot."
        (vector,) = await embed([text])
        good = MemoryRow("kept", "t", "b-good", "s", 1, "user", "turn", text, 1_700_000_000_000, vector)
        await save_memories(stores, [good])
        await stores.vectors.delete(tenant_id="t", user_id="b-good", id="kept")  # as a crash loses it
        # A row PostgreSQL holds and no Milvus row can (written before the API bounded ids as the
        # stores do), of a user the repair meets first.
        bad = MemoryRow("x" * 300, "t", "a-bad", "s", 1, "user", "turn", "too long an id", 1_700_000_000_000, [])
        await stores.keywords.upsert([bad])

        result = await repair_vectors(stores, embed)

        assert (result.written, result.unstorable) == (1, 1)
        assert [h.id for h in await stores.vectors.fetch("t", "b-good", ["kept"])] == ["kept"]
    finally:
        await stores.close()


def _legacy_collection(uri: str, name: str, dim: int, rows: list[MemoryRow]) -> None:
    """A collection as the code of key scheme 1 made and wrote it: keyed by the memory id alone."""
    client = MilvusClient(uri=uri, grpc_options=GRPC_OPTIONS)
    try:
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=64)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
        for field in ("tenant_id", "user_id", "session_id"):
            schema.add_field(field, DataType.VARCHAR, max_length=128)
        schema.add_field("seq", DataType.INT64)
        schema.add_field("role", DataType.VARCHAR, max_length=16)
        schema.add_field("kind", DataType.VARCHAR, max_length=16)
        schema.add_field("text", DataType.VARCHAR, max_length=16064)
        schema.add_field("created_at", DataType.INT64)
        index = client.prepare_index_params()
        index.add_index(field_name="vector", index_type="HNSW", metric_type="COSINE", params={"M": 16, "efConstruction": 200})
        client.create_collection(name, schema=schema, index_params=index, consistency_level="Strong")
        for number in range(LEGACY_PARTITIONS):
            client.create_partition(name, f"p{number:03d}")
        for row in rows:  # one at a time: a later row of the same id replaces an earlier one, as it did
            record = {k: v for k, v in milvus_record(row).items() if k != "pk"}
            client.upsert(name, [record], partition_name=partition_of(row.tenant_id, row.user_id, LEGACY_PARTITIONS))
    finally:
        client.close()


def _random(seed: int, dim: int) -> list[float]:
    """A vector no model gives any text: found at similarity 1 only if it was copied."""
    v = np.random.default_rng(seed).normal(size=dim).astype("float32")
    return (v / np.linalg.norm(v)).tolist()


async def test_vectors_of_the_older_key_scheme_move_to_owner_keys(backends, fresh_dsn, milvus_uri, embed):
    base = "move_" + uuid.uuid4().hex[:8]
    env = backends.env | {"POSTGRES_DSN": fresh_dsn, "MILVUS_URI": milvus_uri}
    settings = Settings(**env, milvus_collection=base, milvus_partitions=LEGACY_PARTITIONS)
    dim = settings.embedding_dim

    def memory(memory_id: str, tenant: str, user: str, text: str, seed: int) -> MemoryRow:
        return MemoryRow(memory_id, tenant, user, "", 0, "memory", "memory", text, 1_700_000_000_000 + seed, _random(seed, dim))

    alice = [memory(f"a-{i}", "t1", "alice", f"alice remembers item {i}", i) for i in range(4)]
    alice_note = memory("note-1", "t1", "alice", "Alice parks on level 3.", 10)
    # Bob shares Alice's partition: there her "note-1" replaced his under the older scheme.
    partition = partition_of("t1", "alice", LEGACY_PARTITIONS)
    bob = next(f"bob{i}" for i in range(1000) if partition_of("t2", f"bob{i}", LEGACY_PARTITIONS) == partition)
    bob_note = memory("note-1", "t2", bob, "Bob is allergic to penicillin.", 11)
    carol = memory("c" * 100, "t1", "carol", "Carol's id is longer than the older Milvus key.", 12)
    dave = memory("gone", "t1", "dave", "Dave forgot this one.", 13)
    erin = memory("old-model", "t1", "erin", "Erin's vector is an older embedding's.", 14)
    # Bob's note first, then Alice's of the same id: hers replaces his.
    _legacy_collection(milvus_uri, base, dim, [*alice, bob_note, alice_note, dave, erin])

    stores = await Stores.connect(settings)
    try:
        assert stores.vectors.legacy == base
        await stores.keywords.upsert([*alice, alice_note, bob_note, carol, dave, erin])
        # As PostgreSQL holds the rows of the older code after its migration: key scheme 1.
        await stores.keywords.pool.execute("UPDATE memory_keywords SET vector_keys = 1")
        await stores.keywords.pool.execute("UPDATE memory_keywords SET embedding = 1 WHERE user_id = 'erin'")
        await delete_memories(stores, "t1", user="dave", memory_id="gone")  # deleted before the move: stays gone

        assert await repair_vectors(stores, embed) == VectorPass(0, 0)  # the older scheme's rows are the move's
        assert await move_vectors(stores, embed, chunk=2, max_chunks=1) == VectorPass(2, 0)
    finally:
        await stores.close()

    stores = await Stores.connect(settings)  # a restart goes on with the rest
    other = VectorStore(milvus_uri, base, dim, partitions=LEGACY_PARTITIONS)  # another replica's
    try:
        assert stores.vectors.legacy == other.legacy == base
        assert await move_vectors(stores, embed, chunk=2) == VectorPass(6, 0)
        assert stores.vectors.legacy is None
        # The other replica finds the older collection gone: nothing to copy, nothing to drop.
        assert await other.legacy_vectors("t1", "alice", ["a-0"]) == {} and other.legacy is None
        await other.drop_legacy()
        stamps = await stores.keywords.pool.fetch("SELECT DISTINCT vector_keys FROM memory_keywords")
        assert [r["vector_keys"] for r in stamps] == [VECTOR_KEYS]
        for row in [*alice, alice_note]:  # copied: the older collection's vector, not a new embedding
            (top,) = await stores.vectors.search_dense_ids(row.tenant_id, row.user_id, row.vector, limit=1)
            assert top[0] == row.id and top[1] == pytest.approx(1.0, abs=1e-3)
        for row in (bob_note, carol, erin):  # lost, taken by Alice, or an older embedding: embedded again
            (vector,) = await embed([row.text])
            (top,) = await stores.vectors.search_dense_ids(row.tenant_id, row.user_id, vector, limit=1)
            assert top[0] == row.id and top[1] == pytest.approx(1.0, abs=1e-3)
        assert [h.text for h in await stores.vectors.fetch("t2", bob, ["note-1"])] == [bob_note.text]
        assert await stores.vectors.fetch("t1", "dave", ["gone"]) == []
        assert await move_vectors(stores, embed) == VectorPass(0, 0)
        assert await repair_vectors(stores, embed) == VectorPass(0, 0)
    finally:
        await other.close()
        await stores.close()
    client = MilvusClient(uri=milvus_uri, grpc_options=GRPC_OPTIONS)
    try:
        assert not client.has_collection(base)
    finally:
        client.close()
