"""Long-term vector memory in Milvus (Milvus Lite embedded, Milvus server in production).

One row per user or assistant turn (id derived from tenant, session, seq, so a retry upserts),
plus memories added directly. The user id is the partition key. Every filter goes through
`milvus_filter`, which validates field names and quotes values: never an f-string of raw input.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pymilvus import AsyncMilvusClient, DataType, MilvusClient

MAX_TEXT_BYTES = 16000
FILTER_FIELDS = frozenset({"id", "tenant_id", "user_id", "session_id", "seq", "role", "kind"})
_FIELD_RE = re.compile(r"^[a-z_]+$")
OUTPUT_FIELDS = ["id", "tenant_id", "user_id", "session_id", "seq", "role", "kind", "text", "created_at"]


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


def _clip(text: str) -> str:
    data = text.encode("utf-8")
    if len(data) <= MAX_TEXT_BYTES:
        return text
    return data[:MAX_TEXT_BYTES].decode("utf-8", errors="ignore")


@dataclass
class MemoryRow:
    id: str
    tenant_id: str
    user_id: str
    session_id: str
    seq: int
    role: str
    kind: str
    text: str
    created_at_ms: int
    vector: list[float]

    def record(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "vector": self.vector,
            "tenant_id": self.tenant_id,
            "user_id": self.user_id,
            "session_id": self.session_id,
            "seq": self.seq,
            "role": self.role,
            "kind": self.kind,
            "text": _clip(self.text),
            "created_at": self.created_at_ms,
        }


@dataclass
class Hit:
    id: str
    text: str
    score: float
    session_id: str
    seq: int
    role: str
    kind: str
    created_at_ms: int


def ensure_collection(uri: str, name: str, dim: int, token: str = "") -> None:
    """Create the collection and its index if missing and load it (Lite needs a load after reopen).

    Uses the sync client: Milvus Lite's async client cannot create collections.
    """
    client = MilvusClient(uri=uri, token=token)
    try:
        if not client.has_collection(name):
            schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
            schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=64)
            schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
            schema.add_field("tenant_id", DataType.VARCHAR, max_length=128)
            schema.add_field("user_id", DataType.VARCHAR, max_length=128, is_partition_key=True)
            schema.add_field("session_id", DataType.VARCHAR, max_length=128)
            schema.add_field("seq", DataType.INT64)
            schema.add_field("role", DataType.VARCHAR, max_length=16)
            schema.add_field("kind", DataType.VARCHAR, max_length=16)
            schema.add_field("text", DataType.VARCHAR, max_length=MAX_TEXT_BYTES + 64)
            schema.add_field("created_at", DataType.INT64)
            index = client.prepare_index_params()
            index.add_index(field_name="vector", index_type="AUTOINDEX", metric_type="COSINE")
            client.create_collection(name, schema=schema, index_params=index, consistency_level="Strong")
        client.load_collection(name)
    finally:
        client.close()


class VectorStore:
    def __init__(self, uri: str, collection: str, dim: int, token: str = ""):
        ensure_collection(uri, collection, dim, token)
        self.client = AsyncMilvusClient(uri=uri, token=token)
        self.collection = collection
        self.dim = dim

    async def close(self) -> None:
        await self.client.close()

    async def ping(self) -> bool:
        # A metadata call: a query would make Milvus Lite scan rows.
        return bool(await self.client.has_collection(self.collection))

    async def flush(self) -> None:
        """Seal buffered rows into an indexed segment. Milvus Lite scans unflushed rows one by one in
        Python on every search (~30 us each), so the embedded profile flushes on a short timer."""
        await self.client.flush(self.collection)

    async def upsert(self, rows: list[MemoryRow]) -> int:
        if not rows:
            return 0
        result = await self.client.upsert(self.collection, [r.record() for r in rows])
        return int(result.get("upsert_count", len(rows))) if isinstance(result, dict) else len(rows)

    async def search(self, tenant: str, user: str, vector: list[float], *, top_k: int, min_score: float) -> list[Hit]:
        if top_k <= 0:
            return []
        result = await self.client.search(
            self.collection,
            data=[vector],
            filter=milvus_filter(tenant_id=tenant, user_id=user),
            limit=top_k,
            output_fields=OUTPUT_FIELDS,
            search_params={"metric_type": "COSINE"},
        )
        hits = []
        for hit in result[0] if result else []:
            entity = hit.get("entity", hit)
            score = float(hit.get("distance", hit.get("score", 0.0)))
            if score < min_score:
                continue
            hits.append(
                Hit(
                    id=str(hit.get("id", entity.get("id"))),
                    text=entity["text"],
                    score=score,
                    session_id=entity["session_id"],
                    seq=int(entity["seq"]),
                    role=entity["role"],
                    kind=entity["kind"],
                    created_at_ms=int(entity["created_at"]),
                )
            )
        return hits

    async def list(self, tenant: str, user: str, *, limit: int, offset: int = 0) -> list[dict[str, Any]]:
        rows = await self.client.query(
            self.collection,
            filter=milvus_filter(tenant_id=tenant, user_id=user),
            output_fields=OUTPUT_FIELDS,
            limit=limit,
            offset=offset,
        )
        return sorted(rows, key=lambda r: (r["created_at"], r["session_id"], r["seq"]))

    async def count_session(self, tenant: str, session: str) -> int:
        rows = await self.client.query(
            self.collection, filter=milvus_filter(tenant_id=tenant, session_id=session), output_fields=["id"], limit=16384
        )
        return len(rows)

    async def delete(self, **equals: str | int | list[str]) -> int:
        result = await self.client.delete(self.collection, filter=milvus_filter(**equals))
        if isinstance(result, dict):
            return int(result.get("delete_count", 0))
        if isinstance(result, list):  # Milvus Lite answers with the deleted primary keys
            return len(result)
        return int(getattr(result, "delete_count", 0) or 0)
