"""Long-term vector memory in Milvus: Milvus Lite or a Milvus standalone server embedded, a Milvus
server in production.

One row per user or assistant turn (id derived from tenant, user, session and text, so a retry
upserts), plus memories added directly. A memory id is unique per owner only, so the primary key is
`vector_key` (a digest of tenant, owner and id) and the memory id a field of its own: the collection
of that key scheme is named by `collection_name`, and a collection of the older scheme (keyed by the
memory id alone) is read only by the pass that moves its vectors over, then dropped.

The keyword side of recall lives in PostgreSQL (`keyword_index`): Milvus Lite's BM25 walks every
row of the collection in Python on each search, while the dense search touches only the searched
partition.

Rows go to one of `partitions` explicit partitions chosen by a hash of (tenant, user), and every
user-scoped search names its partition: Milvus Lite does not prune by partition key and scans a
search's candidate rows in Python, so pruning is what keeps a search at 10k memories in a few ms.
Every filter goes through `milvus_filter`, which validates field names and quotes values: never an
f-string of raw input.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pymilvus import AsyncMilvusClient, DataType, MilvusClient
from pymilvus.client.types import LoadState
from pymilvus.exceptions import MilvusException

from serve_app.core.ids import MAX_ID_LENGTH, VECTOR_KEYS, vector_key
from serve_app.core.records import MAX_LABEL_BYTES, MAX_TEXT_BYTES, Hit, MemoryRow, clip_utf8
from serve_app.runtime.tracing import traced_store

FILTER_FIELDS = frozenset({"pk", "id", "tenant_id", "user_id", "session_id", "seq", "role", "kind"})
_FIELD_RE = re.compile(r"^[a-z_]+$")
OUTPUT_FIELDS = ["id", "tenant_id", "user_id", "session_id", "seq", "role", "kind", "text", "created_at"]
DEFAULT_PARTITIONS = 64
HNSW_EF = 128
# Every Milvus call is bounded: pymilvus otherwise retries an unreachable server for minutes, and a
# request held that long outlives its client's timeout instead of answering 503 with Retry-After.
RPC_TIMEOUT_S = 10.0
# How fresh a read must be. A Milvus server serves a Strong read only once its time tick (200 ms)
# passes the request, so searches are Session reads: this client's own writes are always visible,
# other replicas' within a tick. Reads whose answer decides a repair or a count are Strong.
# (Milvus Lite serves every read from what it holds and ignores the level.)
FRESH = "Strong"
# A Milvus server answers no query whose offset + limit passes its maxQueryResultWindow (an error,
# not an empty page); Milvus Lite has no such bound.
MAX_RESULT_WINDOW = 16384
SESSION = "Session"
# pymilvus pings every 10 s even on an idle connection, and Milvus Lite's gRPC server (grpc's
# defaults) answers such pings with GOAWAY "too many pings": the shared connection of that address is
# then dead for every client that reuses it. Pings only while a call is in flight; a connection that
# broke meanwhile fails the next call within its bound instead.
GRPC_OPTIONS = {"grpc.keepalive_permit_without_calls": False, "grpc.keepalive_time_ms": 60_000}
T = TypeVar("T")
logger = logging.getLogger("ray.serve")


def _is_released(exc: MilvusException) -> bool:
    """Milvus's answer to a read on a collection that is not loaded (any more)."""
    return "call load()" in str(exc) or "not loaded" in str(exc)


def quote_literal(value: str | int) -> str:
    """A Milvus expression literal: ints as digits, strings double-quoted with escapes."""
    if isinstance(value, bool):
        raise TypeError("booleans are not filter values")
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, str):
        raise TypeError(f"unsupported filter value {type(value).__name__}")
    # JSON escapes (\\, \", \n, \t, ...) are Milvus escapes too; non-ASCII stays literal (no \\u).
    return json.dumps(value, ensure_ascii=False)


def milvus_filter(**equals: str | int | list[str]) -> str:
    """`field == value and ...` (or `field in [...]`) from validated names and quoted literals."""
    clauses = []
    for name, value in equals.items():
        if name not in FILTER_FIELDS or not _FIELD_RE.fullmatch(name):
            raise ValueError(f"field {name!r} cannot be filtered on")
        if isinstance(value, list):
            clauses.append(f"{name} in [{', '.join(quote_literal(v) for v in value)}]")
        else:
            clauses.append(f"{name} == {quote_literal(value)}")
    if not clauses:
        raise ValueError("an unfiltered query is never issued")
    return " and ".join(clauses)


def partition_of(tenant: str, user: str, partitions: int) -> str:
    """The partition that holds a user's rows (a stable hash: the same on every replica and restart)."""
    digest = hashlib.sha256(f"{tenant}\x1f{user}".encode()).digest()
    return f"p{int.from_bytes(digest[:4], 'big') % partitions:03d}"


def collection_name(base: str, keys: int = VECTOR_KEYS) -> str:
    """The collection of one key scheme: a new scheme gets a new collection, so replicas of the
    older code keep writing to theirs during an upgrade and the move reads from it undisturbed."""
    return base if keys == 1 else f"{base}_k{keys}"


def milvus_record(row: MemoryRow) -> dict[str, Any]:
    """The Milvus entity of a memory (its text clipped to what the schema holds)."""
    return {
        "pk": vector_key(row.tenant_id, row.user_id, row.id),
        "id": row.id,
        "vector": row.vector,
        "tenant_id": row.tenant_id,
        "user_id": row.user_id,
        "session_id": row.session_id,
        "seq": row.seq,
        "role": row.role,
        "kind": row.kind,
        "text": clip_utf8(row.text, MAX_TEXT_BYTES),
        "created_at": row.created_at_ms,
    }


def _partition_count(client: MilvusClient, name: str) -> int:
    return len([p for p in client.list_partitions(name) if re.fullmatch(r"p\d{3}", p)])


def ensure_collection(uri: str, name: str, dim: int, token: str = "", partitions: int = DEFAULT_PARTITIONS) -> int:
    """Create the collection, its indexes and partitions if missing, load it (Lite needs a load after
    reopen) and return its partition count: an existing collection keeps the count it was made with.
    Every field that holds an id is as wide as the API lets an id be.

    Uses the sync client: Milvus Lite's async client cannot create collections.
    """
    client = MilvusClient(uri=uri, token=token, grpc_options=GRPC_OPTIONS)
    try:
        if not client.has_collection(name):
            schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
            schema.add_field("pk", DataType.VARCHAR, is_primary=True, max_length=len(vector_key("", "", "")))
            schema.add_field("id", DataType.VARCHAR, max_length=MAX_ID_LENGTH)
            schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
            schema.add_field("tenant_id", DataType.VARCHAR, max_length=MAX_ID_LENGTH)
            schema.add_field("user_id", DataType.VARCHAR, max_length=MAX_ID_LENGTH)
            schema.add_field("session_id", DataType.VARCHAR, max_length=MAX_ID_LENGTH)
            schema.add_field("seq", DataType.INT64)
            schema.add_field("role", DataType.VARCHAR, max_length=MAX_LABEL_BYTES)
            schema.add_field("kind", DataType.VARCHAR, max_length=MAX_LABEL_BYTES)
            schema.add_field("text", DataType.VARCHAR, max_length=MAX_TEXT_BYTES + 64)
            schema.add_field("created_at", DataType.INT64)
            index = client.prepare_index_params()
            index.add_index(field_name="vector", index_type="HNSW", metric_type="COSINE", params={"M": 16, "efConstruction": 200})
            client.create_collection(name, schema=schema, index_params=index, consistency_level="Strong")
            for number in range(partitions):
                client.create_partition(name, f"p{number:03d}")
        existing = _partition_count(client, name)
        client.load_collection(name)
        return existing
    finally:
        client.close()


def open_legacy(uri: str, name: str, token: str = "") -> int | None:
    """The partition count of the collection of the older key scheme, loaded for the move to read;
    None when there is none (a new deployment, or the move has finished)."""
    client = MilvusClient(uri=uri, token=token, grpc_options=GRPC_OPTIONS)
    try:
        if not client.has_collection(name):
            return None
        client.load_collection(name)
        return _partition_count(client, name)
    finally:
        client.close()


@traced_store("milvus")
class VectorStore:
    def __init__(self, uri: str, collection: str, dim: int, token: str = "", partitions: int = DEFAULT_PARTITIONS):
        """`collection` is the configured name: the collections of the key schemes derive from it."""
        self.collection = collection_name(collection)
        self.partitions = ensure_collection(uri, self.collection, dim, token, partitions)
        legacy = collection_name(collection, VECTOR_KEYS - 1)
        self.legacy_partitions = open_legacy(uri, legacy, token)
        self.legacy = legacy if self.legacy_partitions is not None else None
        self.client = AsyncMilvusClient(uri=uri, token=token, grpc_options=GRPC_OPTIONS)
        self._uri, self._token = uri, token
        self.dim = dim
        # Called after this client loaded a released collection: Milvus restarted, and Milvus Lite
        # loses the writes it had acknowledged but not yet persisted (services/index_repair.repair_vectors).
        self.on_reload: Callable[[], Awaitable[None]] | None = None
        self._load_lock = asyncio.Lock()
        self._loads = 0
        self._load_attempts = 0

    async def _load(self, seen: int) -> None:
        """Load a released collection once, however many calls found it released since load number
        `seen`: after a restart a burst of writers and readers then waits for one load instead of
        each starting its own beside the upserts of the others (Milvus Lite drops upserts that race
        a load; what it drops anyway, `services/index_repair.repair_vectors` restores)."""
        attempts = self._load_attempts
        async with self._load_lock:
            if self._loads != seen:
                return
            if self._load_attempts != attempts:
                # The load this caller waited for failed: answer now (a 503) rather than queue for
                # a load of its own, one bounded wait after another.
                raise ConnectionError("Milvus could not load the collection just now; retry later")
            self._load_attempts += 1
            await self.client.load_collection(self.collection, timeout=RPC_TIMEOUT_S)
            self._loads += 1
        if self.on_reload is not None:
            try:
                await self.on_reload()
            except Exception as exc:  # the signal is best effort; the load itself succeeded
                logger.warning("reload signal failed: %r", exc)

    def partition(self, tenant: str, user: str) -> str:
        return partition_of(tenant, user, self.partitions)

    async def close(self) -> None:
        await self.client.close()

    async def _loaded(self, read: Callable[[], Awaitable[T]]) -> T:
        """Run a search or query; if Milvus answers that the collection is not loaded (a restarted
        Milvus Lite forgets every load), load it and run it once more."""
        seen = self._loads
        try:
            return await read()
        except MilvusException as exc:
            if not _is_released(exc):
                raise
            await self._load(seen)
            return await read()

    async def ping(self) -> bool:
        # A metadata call: a query would make Milvus Lite scan rows.
        return bool(await self.client.has_collection(self.collection, timeout=RPC_TIMEOUT_S))

    async def flush(self) -> None:
        """Seal buffered rows into an indexed segment. Milvus Lite scans unflushed rows one by one in
        Python on every search, so the embedded profile flushes on a short timer."""
        await self.client.flush(self.collection, timeout=RPC_TIMEOUT_S)

    async def _state(self) -> Any:
        return (await self.client.get_load_state(self.collection, timeout=RPC_TIMEOUT_S)).get("state")

    async def _ensure_loaded(self) -> None:
        """Load the collection if Milvus has released it (a restarted Milvus Lite releases everything)."""
        seen = self._loads
        if await self._state() != LoadState.Loaded:
            await self._load(seen)

    async def upsert(self, rows: list[MemoryRow]) -> int:
        """Rows grouped by partition; an upsert replaces the row with the same id (a retry).

        Acknowledged only once the rows read back: Milvus Lite acknowledges upserts into a released
        collection (after a restart) and then drops them when a load runs meanwhile (found by
        bench/reliability.py). So the collection is loaded first, and missing rows are written again.
        """
        await self._ensure_loaded()
        pending: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            pending.setdefault(self.partition(row.tenant_id, row.user_id), []).append(milvus_record(row))
        for attempt in range(3):
            # Every partition's upsert, then every read-back at once: a server answers a read of
            # fresh writes at its next time tick, so read-backs one after another would each wait one.
            # The upserts go one at a time: Milvus Lite lost rows of concurrent upserts across a
            # restart (tests/contract/test_vector_repair.py).
            partitions = list(pending)
            for p in partitions:
                await self.client.upsert(self.collection, pending[p], partition_name=p, timeout=RPC_TIMEOUT_S)
            missing = await asyncio.gather(*(self._missing(p, [r["pk"] for r in pending[p]], SESSION) for p in partitions))
            pending = {p: [r for r in pending[p] if r["pk"] in gone] for p, gone in zip(partitions, missing, strict=True) if gone}
            if not pending:
                return len(rows)
            if attempt == 2:
                lost = sum(len(records) for records in pending.values())
                raise ConnectionError(f"Milvus did not keep {lost} upserted rows; retry later")
            await self._ensure_loaded()
        return len(rows)

    async def _missing(self, partition: str, keys: list[str], consistency: str) -> set[str]:
        """Which of these primary keys the partition does not hold."""
        found = await self._loaded(
            lambda: self.client.query(
                self.collection,
                filter=milvus_filter(pk=keys),
                output_fields=["pk"],
                partition_names=[partition],
                consistency_level=consistency,
                timeout=RPC_TIMEOUT_S,
            )
        )
        return set(keys) - {str(r["pk"]) for r in found}

    async def missing(self, tenant: str, user: str, ids: list[str], chunk: int = 1000) -> set[str]:
        """Which of the user's memory ids Milvus does not hold (as the user's: by their scoped keys)."""
        partition = self.partition(tenant, user)
        keys = {vector_key(tenant, user, memory_id): memory_id for memory_id in ids}
        wanted = list(keys)
        gone: set[str] = set()
        for start in range(0, len(wanted), chunk):
            gone |= await self._missing(partition, wanted[start : start + chunk], FRESH)
        return {keys[key] for key in gone}

    async def _search(self, tenant: str, user: str | list[str], vector: list[float], limit: int, fields: list[str]) -> Any:
        owners = user if isinstance(user, list) else [user]
        return await self._loaded(
            lambda: self.client.search(
                self.collection,
                data=[vector],
                anns_field="vector",
                filter=milvus_filter(tenant_id=tenant, user_id=user),
                partition_names=sorted({self.partition(tenant, owner) for owner in owners}),
                limit=limit,
                output_fields=fields,
                search_params={"metric_type": "COSINE", "params": {"ef": max(HNSW_EF, limit)}},
                consistency_level=SESSION,
                timeout=RPC_TIMEOUT_S,
            )
        )

    async def search_dense(self, tenant: str, user: str, vector: list[float], *, limit: int) -> list[Hit]:
        """Nearest memories of one user by cosine similarity, best first, with their text."""
        return self._hits(await self._search(tenant, user, vector, limit, OUTPUT_FIELDS)) if limit > 0 else []

    async def search_dense_ids(self, tenant: str, user: str, vector: list[float], *, limit: int) -> list[tuple[str, float, int]]:
        """(id, similarity, created_at ms), best first: no text, so Milvus Lite materializes and
        sends almost nothing (the winners' details come from the keyword index afterwards)."""
        if limit <= 0:
            return []
        result = await self._search(tenant, user, vector, limit, ["id", "created_at"])
        found = []
        for hit in result[0] if result else []:
            entity = hit.get("entity", hit)
            found.append((str(entity["id"]), float(hit.get("distance", hit.get("score", 0.0))), int(entity["created_at"])))
        return found

    async def search_dense_ids_of(
        self, tenant: str, owners: list[str], vector: list[float], *, limit: int
    ) -> list[tuple[str, float, int, str]]:
        """(id, similarity, created_at ms, owner) over the memories of several owners (a user and the
        spaces a grant lets it read): one search, filtered to those owners and their partitions."""
        if limit <= 0 or not owners:
            return []
        result = await self._search(tenant, owners, vector, limit, ["id", "created_at", "user_id"])
        found = []
        for hit in result[0] if result else []:
            entity = hit.get("entity", hit)
            similarity = float(hit.get("distance", hit.get("score", 0.0)))
            found.append((str(entity["id"]), similarity, int(entity["created_at"]), str(entity["user_id"])))
        return found

    async def fetch(self, tenant: str, user: str, ids: list[str]) -> list[Hit]:
        """Memories by id (score 0), the user's own: by their scoped keys."""
        if not ids:
            return []
        keys = [vector_key(tenant, user, memory_id) for memory_id in ids]
        rows = await self._loaded(
            lambda: self.client.query(
                self.collection,
                filter=milvus_filter(pk=keys),
                output_fields=OUTPUT_FIELDS,
                partition_names=[self.partition(tenant, user)],
                consistency_level=SESSION,
                timeout=RPC_TIMEOUT_S,
            )
        )
        return self._hits([[{"distance": 0.0, "entity": r} for r in rows]])

    async def vectors_of(self, tenant: str, user: str, ids: list[str]) -> dict[str, list[float]]:
        """The stored vectors of these memories of the user, by memory id (an export's)."""
        if not ids:
            return {}
        keys = [vector_key(tenant, user, memory_id) for memory_id in ids]
        rows = await self._loaded(
            lambda: self.client.query(
                self.collection,
                filter=milvus_filter(pk=keys),
                output_fields=["id", "vector"],
                partition_names=[self.partition(tenant, user)],
                consistency_level=SESSION,
                timeout=RPC_TIMEOUT_S,
            )
        )
        return {str(r["id"]): [float(x) for x in r["vector"]] for r in rows}

    @staticmethod
    def _hits(result: Any) -> list[Hit]:
        hits = []
        for hit in result[0] if result else []:
            entity = hit.get("entity", hit)
            hits.append(
                Hit(
                    id=str(entity["id"]),
                    text=entity["text"],
                    score=float(hit.get("distance", hit.get("score", 0.0))),
                    session_id=entity["session_id"],
                    seq=int(entity["seq"]),
                    role=entity["role"],
                    kind=entity["kind"],
                    created_at_ms=int(entity["created_at"]),
                )
            )
        return hits

    async def list(self, tenant: str, user: str, *, limit: int, offset: int = 0) -> list[dict[str, Any]]:
        rows = await self._loaded(
            lambda: self.client.query(
                self.collection,
                filter=milvus_filter(tenant_id=tenant, user_id=user),
                output_fields=OUTPUT_FIELDS,
                limit=limit,
                offset=offset,
                consistency_level=SESSION,
                timeout=RPC_TIMEOUT_S,
            )
        )
        return sorted(rows, key=lambda r: (r["created_at"], r["session_id"], r["seq"]))

    async def count_session(self, tenant: str, session: str) -> int:
        rows = await self._loaded(
            lambda: self.client.query(
                self.collection,
                filter=milvus_filter(tenant_id=tenant, session_id=session),
                output_fields=["id"],
                limit=MAX_RESULT_WINDOW,
                consistency_level=FRESH,
                timeout=RPC_TIMEOUT_S,
            )
        )
        return len(rows)

    async def delete(self, **equals: str | int | list[str]) -> int:
        """Returns once the delete is visible to every read. A server's delete by filter does not
        move this client's session timestamp, so a Session read right after it still saw the rows
        for up to a time tick; one Strong read waits for the tick that applies it, and the query
        node then serves every reader from there on. (Lite answers it at once.)"""
        where = milvus_filter(**equals)
        result = await self.client.delete(self.collection, filter=where, timeout=RPC_TIMEOUT_S)
        tenant, user = equals.get("tenant_id"), equals.get("user_id")
        # A user's rows sit in one partition: the read need not walk the others (Lite would).
        scope = [self.partition(tenant, user)] if isinstance(tenant, str) and isinstance(user, str) else None
        await self._loaded(
            lambda: self.client.query(
                self.collection,
                filter=where,
                output_fields=["id"],
                partition_names=scope,
                limit=1,
                consistency_level=FRESH,
                timeout=RPC_TIMEOUT_S,
            )
        )
        if isinstance(result, dict):
            return int(result.get("delete_count", 0))
        if isinstance(result, list):  # Milvus Lite answers with the deleted primary keys
            return len(result)
        return int(getattr(result, "delete_count", 0) or 0)

    async def legacy_vectors(self, tenant: str, user: str, ids: list[str]) -> dict[str, list[float]]:
        """The vectors the collection of the older key scheme holds for these memories of the user, by
        memory id. A row of that scheme with another owner's tenant or user took this memory's key:
        it is not this memory's vector, and is not returned."""
        if self.legacy is None or not ids:
            return {}
        partitions = [partition_of(tenant, user, self.legacy_partitions)] if self.legacy_partitions else None
        legacy = self.legacy

        def read() -> Awaitable[Any]:
            return self.client.query(
                legacy,
                filter=milvus_filter(tenant_id=tenant, user_id=user, id=ids),
                output_fields=["id", "vector"],
                partition_names=partitions,
                consistency_level=FRESH,
                timeout=RPC_TIMEOUT_S,
            )

        try:
            rows = await read()
        except MilvusException as exc:
            if not await self.client.has_collection(legacy, timeout=RPC_TIMEOUT_S):
                # Another replica's move finished and dropped it: what is left is embedded anew.
                self.legacy = None
                return {}
            if not _is_released(exc):
                raise
            await self.client.load_collection(legacy, timeout=RPC_TIMEOUT_S)
            rows = await read()
        return {str(r["id"]): [float(x) for x in r["vector"]] for r in rows}

    async def drop_legacy(self) -> None:
        """Drop the collection of the older key scheme, once every memory's vector is in this one."""
        if self.legacy is None:
            return
        legacy, self.legacy = self.legacy, None
        await asyncio.to_thread(_drop_collection, self._uri, self._token, legacy)
        logger.info("dropped Milvus collection %s: every vector is keyed by its owner now", legacy)


def _drop_collection(uri: str, token: str, name: str) -> None:
    client = MilvusClient(uri=uri, token=token, grpc_options=GRPC_OPTIONS)
    try:
        if client.has_collection(name):  # another replica's move may have dropped it already
            client.drop_collection(name)
    finally:
        client.close()
