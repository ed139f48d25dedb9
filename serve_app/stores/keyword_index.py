"""The keyword side of hybrid recall in PostgreSQL: BM25 over each memory's keyword text.

One row per memory and one posting per (memory, term), keyed by tenant, user and term first, so a
query reads only the postings of its own terms for its own user through one index range scan a
term. A memory is numbered within its user (`doc`, migration 11) and its postings carry that number:
the statement returns each term's postings as arrays of numbers, and `core.bm25` sums them per
memory, which PostgreSQL's executor does a row at a time (most of a search at 100k memories). The
user's memory count, total length and each term's document frequency come from the statistics that
triggers keep as the index changes (migration 6), never counted over every memory of the user.
Persistent, transactional with its writes, and erased with the user's facts. Terms arrive
normalized (`core.keywords`), so no text search configuration is involved.
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import asyncpg
import numpy as np

from serve_app.core.bm25 import SCORE_DIGITS, PostingList, best_documents, idf
from serve_app.core.ids import VECTOR_KEYS
from serve_app.core.keywords import ANALYSIS_VERSION, normalize
from serve_app.core.records import MAX_TEXT_BYTES, Hit, MemoryRow, clip_utf8
from serve_app.encoding import DOCUMENT_EMBEDDING
from serve_app.runtime.tracing import traced_store

MAX_QUERY_TERMS = 64
MAX_KEYWORD_BYTES = 4 * MAX_TEXT_BYTES


def keyword_text(row: MemoryRow) -> str:
    """The terms a memory is indexed under: its keyword text, or its own text's terms."""
    return clip_utf8(row.keywords or normalize(row.text), MAX_KEYWORD_BYTES)


_POSTING_LISTS = """
WITH stats AS (
    SELECT n::float8 AS n, CASE WHEN n > 0 THEN total_length::float8 / n ELSE 1 END AS avgdl
    FROM memory_user_stats WHERE tenant_id = $1 AND user_id = $2
)
SELECT t.df::float8 AS df, s.n, s.avgdl, l.postings
FROM memory_term_stats t CROSS JOIN stats s
CROSS JOIN LATERAL (
    -- One index range scan a term, one array of its postings: (doc << 32) | (tf << 16) | length.
    SELECT array_send(array_agg((p.doc::int8 << 32) | (p.tf::int8 << 16) | p.length)) AS postings
    FROM memory_postings p WHERE p.tenant_id = $1 AND p.user_id = $2 AND p.term = t.term
) l
WHERE t.tenant_id = $1 AND t.user_id = $2 AND t.term = ANY($3::text[]) AND t.df > 0
"""
"""Each query term the user's memories hold: its document frequency and its postings, packed."""

_INT8_OID = 20
MAX_TERMS_A_MEMORY = MAX_KEYWORD_BYTES // 2
"""A term and the space after it take two bytes at least: a memory's length (and so any term's
frequency in it) fits the 16 bits a packed posting gives it."""
assert MAX_TERMS_A_MEMORY < 1 << 16


def int8_array(data: bytes | None) -> np.ndarray:
    """A one-dimensional int8[] without nulls in PostgreSQL's binary form (`array_send`), as numbers."""
    if not data:
        return np.empty(0, dtype=np.int64)
    ndim, has_nulls, element = struct.unpack_from(">iii", data)
    if ndim == 0:
        return np.empty(0, dtype=np.int64)
    if ndim != 1 or has_nulls or element != _INT8_OID:
        raise ValueError(f"expected a one-dimensional int8[] without nulls, got ndim {ndim}, element oid {element}")
    (count,) = struct.unpack_from(">i", data, 12)
    # After the header (ndim, nulls flag, oid, length, lower bound) each element is its length, 8, then its value.
    elements = np.frombuffer(data, dtype=np.dtype([("size", ">i4"), ("value", ">i8")]), offset=20)
    if len(elements) != count:
        raise ValueError(f"int8[] of {count} elements in {len(data)} bytes")
    return elements["value"].astype(np.int64)


def unpack_postings(idf_of_term: float, packed: np.ndarray) -> PostingList:
    """A term's postings as `_POSTING_LISTS` packs them: memory number, frequency, memory length."""
    return PostingList(idf_of_term, packed >> 32, (packed >> 16) & 0xFFFF, packed & 0xFFFF)


@traced_store("postgresql")
class KeywordIndex:
    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    async def upsert(self, rows: Iterable[MemoryRow]) -> int:
        """Index (or re-index) memories; a retry replaces the same rows, never adds postings. The rows'
        vectors are this code's document embedding under this code's key scheme (they are written to
        Milvus beside these)."""
        written = 0
        async with self.pool.acquire() as conn, conn.transaction():
            for (tenant, user), group in _by_user(rows):
                await _lock_user(conn, tenant, user)
                docs = await _numbers(conn, tenant, user, [r.id for r in group])
                lengths = await _replace_postings(conn, tenant, user, group, docs)
                await conn.executemany(
                    """
                    INSERT INTO memory_keywords
                        (tenant_id, user_id, memory_id, session_id, seq, role, kind, text, created_at, length,
                         analysis, context, embedding, vector_keys, agent_id, added_by, origin_user, origin_memory, doc)
                    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)
                    ON CONFLICT (tenant_id, user_id, memory_id) DO UPDATE SET
                        session_id = EXCLUDED.session_id, seq = EXCLUDED.seq, role = EXCLUDED.role,
                        kind = EXCLUDED.kind, text = EXCLUDED.text, created_at = EXCLUDED.created_at,
                        length = EXCLUDED.length, analysis = EXCLUDED.analysis, context = EXCLUDED.context,
                        embedding = EXCLUDED.embedding, vector_keys = EXCLUDED.vector_keys,
                        -- a re-index or repair writes rows without provenance: what was recorded stays
                        agent_id = coalesce(EXCLUDED.agent_id, memory_keywords.agent_id),
                        added_by = coalesce(EXCLUDED.added_by, memory_keywords.added_by),
                        origin_user = coalesce(EXCLUDED.origin_user, memory_keywords.origin_user),
                        origin_memory = coalesce(EXCLUDED.origin_memory, memory_keywords.origin_memory)
                    """,
                    [
                        (
                            tenant,
                            user,
                            r.id,
                            r.session_id,
                            r.seq,
                            r.role,
                            r.kind,
                            r.text,
                            r.created_at_ms,
                            lengths[r.id],
                            ANALYSIS_VERSION,
                            list(r.context),
                            DOCUMENT_EMBEDDING,
                            VECTOR_KEYS,
                            r.agent_id,
                            r.added_by,
                            r.origin_user,
                            r.origin_memory,
                            docs[r.id],
                        )
                        for r in group
                    ],  # fmt: skip
                )
                written += len(group)
        return written

    async def stale(self, limit: int) -> list[IndexedMemory]:
        """Memories indexed with an older keyword analysis than this code's, in session order."""
        rows = await self.pool.fetch(
            "SELECT tenant_id, user_id, memory_id, session_id, seq, role, kind, text, created_at, context"
            " FROM memory_keywords WHERE analysis < $1 ORDER BY tenant_id, user_id, session_id, seq, memory_id LIMIT $2",
            ANALYSIS_VERSION,
            limit,
        )
        return [
            IndexedMemory(
                MemoryRow(
                    id=r["memory_id"],
                    tenant_id=r["tenant_id"],
                    user_id=r["user_id"],
                    session_id=r["session_id"],
                    seq=int(r["seq"]),
                    role=r["role"],
                    kind=r["kind"],
                    text=r["text"],
                    created_at_ms=int(r["created_at"]),
                    vector=[],
                    context=tuple(r["context"] or ()),
                ),
                context_known=r["context"] is not None,
            )
            for r in rows
        ]

    async def session_turns(self, tenant: str, user: str, sessions: list[str]) -> dict[str, list[tuple[int, str]]]:
        """(seq, text) of every turn memory of these sessions of a user, in seq order."""
        rows = await self.pool.fetch(
            "SELECT session_id, seq, text FROM memory_keywords"
            " WHERE tenant_id = $1 AND user_id = $2 AND session_id = ANY($3::text[]) AND kind = 'turn' ORDER BY session_id, seq",
            tenant,
            user,
            sessions,
        )
        found: dict[str, list[tuple[int, str]]] = {}
        for r in rows:
            found.setdefault(r["session_id"], []).append((int(r["seq"]), r["text"]))
        return found

    async def reindex(self, rows: Iterable[MemoryRow]) -> int:
        """Index again, under this code's analysis, memories still indexed with an older one (a row
        written meanwhile by the memorizer is current already and left as it is)."""
        done = 0
        async with self.pool.acquire() as conn, conn.transaction():
            for (tenant, user), group in _by_user(rows):
                await _lock_user(conn, tenant, user)
                still = {
                    r["memory_id"]: r["doc"]
                    for r in await conn.fetch(
                        "SELECT memory_id, doc FROM memory_keywords WHERE tenant_id = $1 AND user_id = $2"
                        " AND memory_id = ANY($3::text[]) AND analysis < $4",
                        tenant,
                        user,
                        [r.id for r in group],
                        ANALYSIS_VERSION,
                    )
                }
                group = [r for r in group if r.id in still]
                if not group:
                    continue
                lengths = await _replace_postings(conn, tenant, user, group, still)
                await conn.executemany(
                    "UPDATE memory_keywords SET length = $4, analysis = $5, context = $6"
                    " WHERE tenant_id = $1 AND user_id = $2 AND memory_id = $3",
                    [(tenant, user, r.id, lengths[r.id], ANALYSIS_VERSION, list(r.context)) for r in group],
                )
                done += len(group)
        return done

    async def embedded_before(self, limit: int) -> list[tuple[str, str, Hit]]:
        """(tenant, user, memory) of memories whose vectors an older document embedding made."""
        rows = await self.pool.fetch(
            f"SELECT tenant_id, user_id, {_HIT_COLUMNS} FROM memory_keywords WHERE embedding < $1"
            " ORDER BY tenant_id, user_id, memory_id LIMIT $2",
            DOCUMENT_EMBEDDING,
            limit,
        )
        return [(r["tenant_id"], r["user_id"], _hit(r, None)) for r in rows]

    async def mark_embedded(self, tenant: str, user: str, memories: list[Hit]) -> int:
        """Record that these memories' vectors are this code's embedding of their text, written under
        this code's key scheme: a memory whose text changed meanwhile was written again, by its
        writer, and is left as it is."""
        return await self._mark(tenant, user, memories, "k.embedding < $3")

    async def _mark(self, tenant: str, user: str, memories: list[Hit], stale: str) -> int:
        """Stamp the memories `stale` selects (of those with the given texts) as written by this code."""
        done = await self.pool.fetchval(
            "WITH marked AS (UPDATE memory_keywords k SET embedding = $3, vector_keys = $6"
            " FROM unnest($4::text[], $5::text[]) AS m(id, text)"
            f" WHERE k.tenant_id = $1 AND k.user_id = $2 AND k.memory_id = m.id AND k.text = m.text AND {stale}"
            " RETURNING 1) SELECT count(*) FROM marked",
            tenant,
            user,
            DOCUMENT_EMBEDDING,
            [m.id for m in memories],
            [m.text for m in memories],
            VECTOR_KEYS,
        )
        return int(done)

    async def keyed_before(self, *, after: tuple[str, str, str] | None, limit: int) -> list[tuple[str, str, Hit, bool]]:
        """(tenant, user, memory, embedded by this code) of memories whose vectors an older Milvus key
        scheme holds, in (tenant, user, id) order after `after`: a pass goes on past the ones it had
        to skip."""
        tenant, user, memory_id = after or ("", "", "")
        rows = await self.pool.fetch(
            f"SELECT tenant_id, user_id, embedding, {_HIT_COLUMNS} FROM memory_keywords WHERE vector_keys < $1"
            " AND (tenant_id, user_id, memory_id) > ($2, $3, $4) ORDER BY tenant_id, user_id, memory_id LIMIT $5",
            VECTOR_KEYS,
            tenant,
            user,
            memory_id,
            limit,
        )
        return [(r["tenant_id"], r["user_id"], _hit(r, None), r["embedding"] >= DOCUMENT_EMBEDDING) for r in rows]

    async def mark_keyed(self, tenant: str, user: str, memories: list[Hit]) -> int:
        """Record that these memories' vectors are this code's embedding of their text, written under
        this code's key scheme: one whose text changed meanwhile was written again, by its writer,
        and is left as it is."""
        return await self._mark(tenant, user, memories, "k.vector_keys < $6")

    async def search(self, tenant: str, user: str, terms: str, *, limit: int) -> list[Hit]:
        """BM25 of one user's memories against `terms` (normalized, space-separated), best first, ties
        by memory id. Each hit's `coverage` is the share of the query's weight (the sum of its terms'
        idf) it matches: an absolute measure, where BM25 scores only compare memories of one query."""
        unique = list(dict.fromkeys(terms.split()))[:MAX_QUERY_TERMS]
        if limit <= 0 or not unique:
            return []
        # One snapshot for both reads: a memory's number names the same memory in each.
        async with self.pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            terms_held = await conn.fetch(_POSTING_LISTS, tenant, user, unique)
            if not terms_held:
                return []
            n, avgdl = terms_held[0]["n"], terms_held[0]["avgdl"]
            lists = [unpack_postings(idf(t["df"], n), int8_array(t["postings"])) for t in terms_held]
            ranked = best_documents(lists, avgdl, limit)
            rows = await conn.fetch(
                f"SELECT doc, {_HIT_COLUMNS} FROM memory_keywords WHERE tenant_id = $1 AND user_id = $2 AND doc = ANY($3::int[])",
                tenant,
                user,
                ranked.docs.tolist(),
            )
        by_doc = {r["doc"]: r for r in rows}
        # The query's whole weight: terms no memory holds weigh most (df 0) and match nothing.
        query_idf = sum(p.idf for p in lists) + (len(unique) - len(lists)) * idf(0.0, n)
        # A posting whose memory row is gone (a manual DELETE of the row alone) names no memory.
        found = [
            (-score, by_doc[doc]["memory_id"], by_doc[doc], matched)
            for doc, score, matched in zip(ranked.docs.tolist(), ranked.scores.tolist(), ranked.matched_idf.tolist(), strict=True)
            if doc in by_doc
        ]
        # Equal scores by memory id. Memories whose scores are equal but for the order their terms
        # were added in differ in the last bits, so scores are compared to SCORE_DIGITS places.
        found.sort(key=lambda f: (round(f[0], SCORE_DIGITS), f[1]))
        return [
            _hit(row, matched / query_idf if query_idf > 0 else 0.0, score=-negated) for negated, _, row, matched in found[:limit]
        ]

    async def promoted_from(self, tenant: str, user: str) -> list[tuple[str, str]]:
        """(owner, memory id) of every copy promoted from the user's memory into a space."""
        rows = await self.pool.fetch(
            "SELECT user_id, memory_id FROM memory_keywords WHERE tenant_id = $1 AND origin_user = $2 ORDER BY 1, 2",
            tenant,
            user,
        )
        return [(r["user_id"], r["memory_id"]) for r in rows]

    async def pseudonymise(self, tenant: str, user: str, alias: str) -> int:
        """Name the user by `alias` in the provenance of the copies promoted from its memory."""
        status = await self.pool.execute(
            "UPDATE memory_keywords SET origin_user = $3 WHERE tenant_id = $1 AND origin_user = $2", tenant, user, alias
        )
        return int(status.split()[-1])

    async def users(self) -> list[tuple[str, str]]:
        """Every (tenant, user) with a memory."""
        rows = await self.pool.fetch("SELECT DISTINCT tenant_id, user_id FROM memory_keywords ORDER BY 1, 2")
        return [(r["tenant_id"], r["user_id"]) for r in rows]

    async def list_users(self, tenant: str, *, after: str, limit: int) -> list[tuple[str, int, int]]:
        """The tenant's users with a memory or a current fact, by id after `after`: (user, memories,
        current facts). A loose index scan (one index probe per user) over each table, so a page
        costs its users, not the tenant's rows; memory spaces are stepped over."""
        rows = await self.pool.fetch(
            """
            WITH RECURSIVE mem(u, n) AS (
                (SELECT user_id, (user_id NOT LIKE 'space:%')::int FROM memory_keywords
                 WHERE tenant_id = $1 AND user_id > $2 ORDER BY user_id LIMIT 1)
                UNION ALL
                SELECT nxt.u, mem.n + (nxt.u NOT LIKE 'space:%')::int
                FROM mem, LATERAL (
                    SELECT (SELECT user_id FROM memory_keywords WHERE tenant_id = $1 AND user_id > mem.u
                            ORDER BY user_id LIMIT 1) AS u
                ) nxt
                WHERE mem.u IS NOT NULL AND mem.n < $3
            ),
            fct(u, n) AS (
                (SELECT user_id, (user_id NOT LIKE 'space:%')::int FROM facts
                 WHERE tenant_id = $1 AND user_id > $2 AND valid_to IS NULL ORDER BY user_id LIMIT 1)
                UNION ALL
                SELECT nxt.u, fct.n + (nxt.u NOT LIKE 'space:%')::int
                FROM fct, LATERAL (
                    SELECT (SELECT user_id FROM facts WHERE tenant_id = $1 AND user_id > fct.u AND valid_to IS NULL
                            ORDER BY user_id LIMIT 1) AS u
                ) nxt
                WHERE fct.u IS NOT NULL AND fct.n < $3
            ),
            -- Memory spaces (core.spaces) sit under owner ids beside the users: stepped over, not listed.
            page AS (
                SELECT u FROM (SELECT u FROM mem UNION SELECT u FROM fct) both_sides
                WHERE u IS NOT NULL AND u NOT LIKE 'space:%' ORDER BY u LIMIT $3
            )
            SELECT page.u AS user_id,
                   (SELECT count(*) FROM memory_keywords k WHERE k.tenant_id = $1 AND k.user_id = page.u) AS memories,
                   (SELECT count(*) FROM facts f WHERE f.tenant_id = $1 AND f.user_id = page.u AND f.valid_to IS NULL) AS facts
            FROM page ORDER BY page.u
            """,
            tenant,
            after,
            limit,
        )
        return [(r["user_id"], int(r["memories"]), int(r["facts"])) for r in rows]

    async def session_memories(self, tenant: str, user: str, session: str, *, limit: int) -> list[Hit]:
        """The user's memories made from one session (score 0), in the session's order."""
        rows = await self.pool.fetch(
            "SELECT memory_id, session_id, seq, role, kind, text, created_at, 0.0::float8 AS score FROM memory_keywords"
            " WHERE tenant_id = $1 AND session_id = $2 AND user_id = $3 ORDER BY seq, memory_id LIMIT $4",
            tenant,
            session,
            user,
            limit,
        )
        return [_hit(r) for r in rows]

    async def memory_ids(self, tenant: str, user: str) -> list[str]:
        """The user's memories whose vectors are under this code's key scheme (those of an older one
        are the move's to write, not a repair's)."""
        rows = await self.pool.fetch(
            "SELECT memory_id FROM memory_keywords WHERE tenant_id = $1 AND user_id = $2 AND vector_keys >= $3"
            " ORDER BY memory_id",
            tenant,
            user,
            VECTOR_KEYS,
        )
        return [r["memory_id"] for r in rows]

    async def page(self, tenant: str, user: str, *, after: str, limit: int) -> list[Hit]:
        """The user's memories by id after `after` (score 0), every one of them: an export's pages."""
        rows = await self.pool.fetch(
            f"SELECT {_HIT_COLUMNS} FROM memory_keywords WHERE tenant_id = $1 AND user_id = $2 AND memory_id > $3"
            " ORDER BY memory_id LIMIT $4",
            tenant,
            user,
            after,
            limit,
        )
        return [_hit(r) for r in rows]

    async def has_session(self, tenant: str, user: str, session: str) -> bool:
        """Whether the user has a memory of this session (its log may have expired since)."""
        return bool(
            await self.pool.fetchval(
                "SELECT EXISTS (SELECT 1 FROM memory_keywords WHERE tenant_id = $1 AND session_id = $2 AND user_id = $3)",
                tenant,
                session,
                user,
            )
        )

    async def count(self, tenant: str) -> int:
        """Memories the tenant stores (every memory has exactly one row here): what quotas count."""
        return int(await self.pool.fetchval("SELECT count(*) FROM memory_keywords WHERE tenant_id = $1", tenant))

    async def fetch(self, tenant: str, user: str, ids: list[str]) -> list[Hit]:
        """Memories by id (score 0), restricted to the tenant and user."""
        if not ids:
            return []
        rows = await self.pool.fetch(
            f"SELECT {_HIT_COLUMNS} FROM memory_keywords WHERE tenant_id = $1 AND user_id = $2 AND memory_id = ANY($3::text[])",
            tenant,
            user,
            ids,
        )
        return [_hit(r) for r in rows]

    async def delete(
        self, tenant: str, *, user: str | None = None, session: str | None = None, memory_id: str | None = None
    ) -> int:
        """Remove memories by user, by session or one by id (within the tenant); returns how many."""
        clauses, args = ["tenant_id = $1"], [tenant]
        for column, value in (("user_id", user), ("session_id", session), ("memory_id", memory_id)):
            if value is not None:
                args.append(value)
                clauses.append(f"{column} = ${len(args)}")
        if len(args) == 1:
            raise ValueError("a keyword delete names a user, a session or a memory")
        async with self.pool.acquire() as conn, conn.transaction():
            removed = await conn.fetch(f"DELETE FROM memory_keywords WHERE {' AND '.join(clauses)} RETURNING user_id, doc", *args)
            if removed:
                await conn.execute(
                    """
                    DELETE FROM memory_postings p USING unnest($2::text[], $3::int[]) AS gone(user_id, doc)
                    WHERE p.tenant_id = $1 AND p.user_id = gone.user_id AND p.doc = gone.doc
                    """,
                    tenant,
                    [r["user_id"] for r in removed],
                    [r["doc"] for r in removed],
                )
        return len(removed)


@dataclass
class IndexedMemory:
    row: MemoryRow
    context_known: bool
    """False for a memory indexed before its context was kept: it is read from its session's turns."""


def _by_user(rows: Iterable[MemoryRow]) -> list[tuple[tuple[str, str], list[MemoryRow]]]:
    by_user: dict[tuple[str, str], list[MemoryRow]] = {}
    for row in rows:
        by_user.setdefault((row.tenant_id, row.user_id), []).append(row)
    return sorted(by_user.items())


async def _lock_user(conn: asyncpg.Connection, tenant: str, user: str) -> None:
    """Writers of one user take turns (two memorizers replacing the same postings would otherwise
    deadlock on each other's rows); other users are not held up."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", f"{tenant}\x1f{user}")
    # The user's statistics row first, as a delete does (its keyword rows, then its postings): the
    # triggers of migration 6 then lock one user's rows in the same order on every path.
    await conn.execute(
        "INSERT INTO memory_user_stats (tenant_id, user_id, n, total_length) VALUES ($1, $2, 0, 0)"
        " ON CONFLICT (tenant_id, user_id) DO UPDATE SET n = memory_user_stats.n",
        tenant,
        user,
    )


async def _numbers(conn: asyncpg.Connection, tenant: str, user: str, memory_ids: list[str]) -> dict[str, int]:
    """Each memory's number within its user: the one it has, or the next after the user's highest.
    Called under the user's lock (`_lock_user`), so two writers never hand out one number; a number
    freed by a delete may be given again, which a search's single snapshot makes safe."""
    rows = await conn.fetch(
        "SELECT memory_id, doc FROM memory_keywords WHERE tenant_id = $1 AND user_id = $2 AND memory_id = ANY($3::text[])",
        tenant,
        user,
        memory_ids,
    )
    numbers = {r["memory_id"]: r["doc"] for r in rows}
    new = [m for m in dict.fromkeys(memory_ids) if m not in numbers]
    if new:
        highest = await conn.fetchval("SELECT max(doc) FROM memory_keywords WHERE tenant_id = $1 AND user_id = $2", tenant, user)
        first = -1 if highest is None else highest
        numbers.update({m: first + 1 + i for i, m in enumerate(new)})
    return numbers


async def _replace_postings(
    conn: asyncpg.Connection, tenant: str, user: str, group: list[MemoryRow], docs: dict[str, int]
) -> dict[str, int]:
    """Replace the postings of these memories of one user (numbered by `docs`); returns each
    memory's length in terms."""
    await conn.execute(
        "DELETE FROM memory_postings WHERE tenant_id = $1 AND user_id = $2 AND doc = ANY($3::int[])",
        tenant,
        user,
        sorted({docs[r.id] for r in group}),
    )
    terms_of = {r.id: Counter(keyword_text(r).split()) for r in group}
    lengths = {memory_id: sum(counts.values()) for memory_id, counts in terms_of.items()}
    postings = {
        (term, docs[memory_id]): (tf, lengths[memory_id]) for memory_id, counts in terms_of.items() for term, tf in counts.items()
    }
    if postings:
        terms, numbers = (list(column) for column in zip(*postings, strict=True))
        tfs, term_lengths = (list(column) for column in zip(*postings.values(), strict=True))
        await conn.execute(
            """
            INSERT INTO memory_postings (tenant_id, user_id, term, doc, tf, length)
            SELECT $1, $2, * FROM unnest($3::text[], $4::int[], $5::int[], $6::int[])
            """,
            tenant,
            user,
            terms,
            numbers,
            tfs,
            term_lengths,
        )
    return lengths


_HIT_COLUMNS = (
    "memory_id, session_id, seq, role, kind, text, created_at, 0.0::float8 AS score,"
    " agent_id, added_by, origin_user, origin_memory"
)
"""A memory as `_hit` reads it, by id (score 0)."""


def _hit(row: asyncpg.Record, coverage: float | None = None, *, score: float | None = None) -> Hit:
    return Hit(
        id=row["memory_id"],
        text=row["text"],
        score=float(row["score"] if score is None else score),
        session_id=row["session_id"],
        seq=int(row["seq"]),
        role=row["role"],
        kind=row["kind"],
        created_at_ms=int(row["created_at"]),
        coverage=coverage,
        agent_id=row.get("agent_id"),
        added_by=row.get("added_by"),
        origin_user=row.get("origin_user"),
        origin_memory=row.get("origin_memory"),
    )
