"""Vector store contract against a real Milvus Lite and a real Milvus standalone server."""

import uuid

import numpy as np
import pytest

from serve_app.core.ids import MAX_ID_LENGTH, turn_memory_id
from serve_app.core.records import MemoryRow
from serve_app.stores.vectors import MAX_RESULT_WINDOW, VectorStore, milvus_filter, partition_of

DIM = 8
HOSTILE = ['x" or user_id != "', 'q\\"\n\u00e9', "a\\", '"', "' or 1==1 or '", "\u202eevil", 'x" || true || "']


@pytest.fixture(scope="module")
def collection() -> str:
    return "test_" + uuid.uuid4().hex[:8]


@pytest.fixture
async def vectors(milvus_uri, collection):
    store = VectorStore(milvus_uri, collection, DIM)
    yield store
    await store.close()


def _vec(seed: int) -> list[float]:
    v = np.random.default_rng(seed).normal(size=DIM).astype("float32")
    return (v / np.linalg.norm(v)).tolist()


def _row(tenant, user, session, seq, seed=None, text="t") -> MemoryRow:
    return MemoryRow(
        id=turn_memory_id(tenant, user, session, "user", f"{text} (turn {seq})"),
        tenant_id=tenant,
        user_id=user,
        session_id=session,
        seq=seq,
        role="user",
        kind="turn",
        text=text,
        created_at_ms=seq,
        vector=_vec(seed or seq),
    )


async def test_upsert_is_idempotent_by_deterministic_id(vectors):
    rows = [_row("t", "alice", "s-up", i) for i in range(1, 6)]
    await vectors.upsert(rows)
    await vectors.upsert(rows)  # a retried memorization
    assert await vectors.count_session("t", "s-up") == 5


async def test_search_is_scoped_to_tenant_and_user(vectors):
    await vectors.upsert([_row("t", "alice", "s-a", 1, seed=42, text="alice secret")])
    await vectors.upsert([_row("t", "bob", "s-b", 1, seed=42, text="bob secret")])
    await vectors.upsert([_row("t2", "alice", "s-c", 1, seed=42, text="other tenant")])
    hits = await vectors.search_dense("t", "alice", _vec(42), limit=10)
    assert hits[0].text == "alice secret" and hits[0].score == pytest.approx(1.0, abs=1e-4)
    assert all(h.session_id not in ("s-b", "s-c") for h in hits)
    ids = await vectors.search_dense_ids("t", "alice", _vec(42), limit=10)
    assert [i for i, _, _ in ids] == [h.id for h in hits] and ids[0][2] == hits[0].created_at_ms
    assert {h.id for h in await vectors.fetch("t", "alice", [ids[0][0], "missing"])} == {ids[0][0]}
    assert await vectors.fetch("t", "bob", [ids[0][0]]) == []  # another user's id is not theirs


def test_partition_is_a_stable_hash():
    assert partition_of("t", "alice", 64) == partition_of("t", "alice", 64)
    assert {partition_of("t", f"u{i}", 64) for i in range(500)} == {f"p{i:03d}" for i in range(64)}


@pytest.mark.parametrize("hostile", HOSTILE)
async def test_hostile_values_never_widen_a_filter(vectors, hostile):
    await vectors.upsert([_row("t", "victim", "s-v", 1, seed=7, text="victim data")])
    hits = await vectors.search_dense("t", hostile, _vec(7), limit=50)
    assert all(h.text != "victim data" for h in hits)
    assert await vectors.list("t", hostile, limit=100) == []
    assert await vectors.delete(tenant_id="t", user_id=hostile) == 0
    assert await vectors.count_session("t", "s-v") == 1


def test_filter_builder_rejects_unknown_fields():
    with pytest.raises(ValueError):
        milvus_filter(**{"user_id or 1": "x"})
    with pytest.raises(ValueError):
        milvus_filter()
    assert milvus_filter(user_id='a"b') == 'user_id == "a\\"b"'


async def test_delete_session_deletes_its_vectors(vectors):
    await vectors.upsert([_row("t", "dave", "s-del", i) for i in range(1, 4)])
    await vectors.upsert([_row("t", "dave", "s-keep", 1)])
    assert await vectors.delete(tenant_id="t", session_id="s-del") == 3
    assert await vectors.count_session("t", "s-del") == 0
    assert await vectors.count_session("t", "s-keep") == 1


async def test_a_deleted_memory_is_gone_from_the_next_read(vectors, milvus_uri, collection):
    """The reads a request makes (Session level: a list, a search, a fetch) no longer see a memory once
    its delete has returned, on the replica that deleted it as on any other."""
    kept, gone = _row("t", "erin", "s-forget", 1, seed=11), _row("t", "erin", "s-forget", 2, seed=12)
    await vectors.upsert([kept, gone])
    assert await vectors.delete(tenant_id="t", user_id="erin", id=gone.id) == 1
    assert [r["id"] for r in await vectors.list("t", "erin", limit=10)] == [kept.id]
    assert [i for i, _, _ in await vectors.search_dense_ids("t", "erin", _vec(12), limit=10)] == [kept.id]
    assert await vectors.fetch("t", "erin", [gone.id]) == []
    other = VectorStore(milvus_uri, collection, DIM)
    try:
        assert [r["id"] for r in await other.list("t", "erin", limit=10)] == [kept.id]
    finally:
        await other.close()


async def test_the_last_page_inside_the_result_window_is_served(vectors):
    """The API refuses a page past MAX_RESULT_WINDOW; the last page inside it lists (empty) on both engines."""
    assert await vectors.list("t", "nobody", limit=84, offset=MAX_RESULT_WINDOW - 84) == []


def _partition_mates(partitions: int = 64) -> tuple[tuple[str, str], tuple[str, str], tuple[str, str]]:
    """(tenant, user) of three owners whose rows share one partition: two tenants, and a second user
    of the first tenant."""
    wanted = partition_of("ta", "owner", partitions)
    other = next(f"u{i}" for i in range(10_000) if partition_of("tb", f"u{i}", partitions) == wanted)
    mate = next(f"v{i}" for i in range(10_000) if partition_of("ta", f"v{i}", partitions) == wanted)
    return ("ta", "owner"), ("tb", other), ("ta", mate)


async def test_one_memory_id_of_owners_in_one_partition_is_one_memory_each(vectors):
    """A memory id is the owner's own: another tenant's, or another user's, "note-1" in the same
    partition is another memory, and each owner's repair check sees only its own."""
    owners = _partition_mates(vectors.partitions)
    rows = [
        MemoryRow("note-1", tenant, user, "", 0, "memory", "memory", f"note of {user}", 1, _vec(100 + n))
        for n, (tenant, user) in enumerate(owners)
    ]
    (tenant_b, user_b), (tenant_a, user_a) = owners[1], owners[0]
    await vectors.upsert([rows[1]])
    assert await vectors.missing(tenant_a, user_a, ["note-1"]) == {"note-1"}  # B's row is not A's
    await vectors.upsert([rows[0], rows[2]])
    for n, (tenant, user) in enumerate(owners):
        assert [h.text for h in await vectors.fetch(tenant, user, ["note-1"])] == [f"note of {user}"]
        top = await vectors.search_dense_ids(tenant, user, _vec(100 + n), limit=5)
        assert [(i, round(s, 3)) for i, s, _ in top] == [("note-1", 1.0)]
        assert await vectors.missing(tenant, user, ["note-1"]) == set()
    assert await vectors.delete(tenant_id=tenant_b, user_id=user_b, id="note-1") == 1
    assert await vectors.missing(tenant_b, user_b, ["note-1"]) == {"note-1"}
    assert await vectors.missing(tenant_a, user_a, ["note-1"]) == set()


async def test_ids_as_long_as_the_api_accepts_are_stored(vectors):
    longest = MAX_ID_LENGTH
    tenant, user, session, memory = ("t" * longest, "u" * longest, "s" * longest, "m" * longest)
    row = MemoryRow(memory, tenant, user, session, 1, "user", "turn", "a long-named memory", 5, _vec(77))
    await vectors.upsert([row])
    assert [h.id for h in await vectors.fetch(tenant, user, [memory])] == [memory]
    assert [i for i, _, _ in await vectors.search_dense_ids(tenant, user, _vec(77), limit=1)] == [memory]
    assert [r["id"] for r in await vectors.list(tenant, user, limit=5)] == [memory]
