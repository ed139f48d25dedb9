"""Long-term memories live in two indexes (dense vectors in Milvus, keywords in PostgreSQL): every
write and delete goes through here so that the two never disagree for long.

A write is idempotent in both (deterministic ids, replace-on-retry), so a caller that failed half
way simply retries the whole write; a delete removes from both and reports each count.

PostgreSQL (fsync on commit) is the record: it holds every memory's text and origin. Milvus Lite
acknowledges a write before it is on disk, and a kill -9 loses the last ones (bench/reliability.py
found such losses), so after Milvus restarts `repair_vectors` embeds again what PostgreSQL has and
Milvus lacks. The passes that write vectors from PostgreSQL skip (and count) a memory no Milvus row
can hold, rather than stop at it: the memories after it still get theirs.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import NamedTuple

from pydantic import TypeAdapter

from serve_app import schemas
from serve_app.core.clock import datetime_to_ms, ms_to_datetime
from serve_app.core.ids import direct_memory_id
from serve_app.core.keywords import memory_keywords
from serve_app.core.ranking import Verdict
from serve_app.core.records import Hit, MemoryRow, unstorable
from serve_app.encoding import EmbedMany, Vector
from serve_app.errors import InvalidRequest, MemoryNotFound
from serve_app.services.dependencies import Dependencies
from serve_app.services.quota import check_memory_quota
from serve_app.services.recall import fusion_params, recall
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores
from serve_app.stores.vectors import MAX_RESULT_WINDOW

logger = logging.getLogger("ray.serve")
DIRECT = "memory"  # role and kind of a memory added directly, not memorized from a turn


def memory_row(
    settings: Settings,
    *,
    memory_id: str,
    tenant: str,
    user: str,
    text: str,
    created_at_ms: int,
    vector: Vector,
    session: str = "",
    seq: int = 0,
    role: str = DIRECT,
    kind: str = DIRECT,
    before: Sequence[str] = (),
) -> MemoryRow:
    """A memory as both indexes store it; `before` are the turns that precede a turn memory (its
    keyword text carries them, so a short reply is found through what it answers)."""
    day = ms_to_datetime(created_at_ms).date() if created_at_ms else None
    return MemoryRow(
        id=memory_id,
        tenant_id=tenant,
        user_id=user,
        session_id=session,
        seq=seq,
        role=role,
        kind=kind,
        text=text,
        created_at_ms=created_at_ms,
        vector=vector,
        keywords=memory_keywords(text, before=before, day=day, weight=settings.recall_keyword_self_weight),
        context=tuple(before),
    )


SEARCH_HITS = TypeAdapter(list[schemas.SearchHit])


def hits_out(hits: Sequence[Hit]) -> list[schemas.SearchHit]:
    """The hits as the API shows them, validated in one pass over plain data: a context answers
    with one per memory in its prompt, dozens per request, and one pass costs less than building
    each model on its own, validated or not."""
    return SEARCH_HITS.validate_python(
        [
            {
                "id": hit.id,
                "text": hit.text,
                "score": hit.score,
                "session_id": hit.session_id,
                "seq": hit.seq,
                "created_at": ms_to_datetime(hit.created_at_ms),
            }
            for hit in hits
        ]
    )


def memory_out(hit: Hit) -> schemas.MemoryOut:
    return schemas.MemoryOut(
        id=hit.id,
        text=hit.text,
        session_id=hit.session_id,
        seq=hit.seq,
        role=hit.role,
        kind=hit.kind,
        created_at=ms_to_datetime(hit.created_at_ms),
    )


async def save_memories(stores: Stores, rows: list[MemoryRow]) -> int:
    if not rows:
        return 0
    written, _ = await asyncio.gather(stores.vectors.upsert(rows), stores.keywords.upsert(rows))
    return written


async def delete_memories(
    stores: Stores, tenant: str, *, user: str | None = None, session: str | None = None, memory_id: str | None = None
) -> dict[str, int]:
    """Delete by user, session or one memory id; returns the rows removed from each index."""
    scope: dict[str, str] = {"tenant_id": tenant}
    for field, value in (("user_id", user), ("session_id", session), ("id", memory_id)):
        if value is not None:
            scope[field] = value
    # The record first: a repair that runs meanwhile re-embeds only what PostgreSQL still holds, so
    # it cannot bring back a memory this delete has taken out of Milvus.
    keywords = await stores.keywords.delete(tenant, user=user, session=session, memory_id=memory_id)
    vectors = await stores.vectors.delete(**scope)
    return {"vectors": vectors, "keywords": keywords}


async def add_memory(deps: Dependencies, tenant: str, user_id: str, body: schemas.MemoryIn) -> schemas.MemoryOut:
    """A memory stated directly (not memorized from a turn); the same text added twice is stored once."""
    await check_memory_quota(deps, tenant, 1)
    created = body.created_at or datetime.now(UTC)
    memory_id = body.id or direct_memory_id(tenant, user_id, body.text)
    row = memory_row(
        deps.settings,
        memory_id=memory_id,
        tenant=tenant,
        user=user_id,
        text=body.text,
        created_at_ms=datetime_to_ms(created),
        vector=(await deps.embed_documents([body.text]))[0],
    )
    await save_memories(deps.stores, [row])
    return schemas.MemoryOut(id=memory_id, text=body.text, session_id="", seq=0, role=DIRECT, kind=DIRECT, created_at=created)


async def list_memories(deps: Dependencies, tenant: str, user_id: str, *, limit: int, offset: int) -> list[schemas.MemoryOut]:
    if offset + limit > MAX_RESULT_WINDOW:
        raise InvalidRequest(f"offset + limit must be at most {MAX_RESULT_WINDOW}: Milvus lists no memory past that")
    rows = await deps.stores.vectors.list(tenant, user_id, limit=limit, offset=offset)
    return [
        schemas.MemoryOut(
            id=r["id"],
            text=r["text"],
            session_id=r["session_id"],
            seq=r["seq"],
            role=r["role"],
            kind=r["kind"],
            created_at=ms_to_datetime(r["created_at"]),
        )
        for r in rows
    ]


async def delete_memory(deps: Dependencies, tenant: str, user_id: str, memory_id: str) -> schemas.Deleted:
    removed = await delete_memories(deps.stores, tenant, user=user_id, memory_id=memory_id)
    if not any(removed.values()):
        raise MemoryNotFound()
    return schemas.Deleted(deleted=True, details=removed)


async def search_memories(
    deps: Dependencies, tenant: str, user_id: str, body: schemas.SearchRequest
) -> list[schemas.SearchHit] | schemas.SearchExplained:
    found = await recall(
        deps.stores,
        deps.embed_one,
        tenant,
        user_id,
        body.query,
        top_k=body.top_k,
        settings=deps.settings,
        min_score=body.min_score,
        # An explained search judges and fetches every candidate: not what a search costs.
        observe_ms=None if body.explain else deps.observe_recall("search", tenant),
        explained=body.explain,
    )
    hits = hits_out(found.hits)
    if not body.explain:
        return hits
    params = fusion_params(deps.settings, body.min_score)
    return schemas.SearchExplained(
        hits=hits,
        candidates=[explained_hit(verdict, hit) for verdict, hit in found.verdicts],
        floors=schemas.Floors(
            min_similarity=params.min_similarity,
            min_keyword_share=params.min_keyword_share,
            min_keyword_coverage=params.min_keyword_coverage,
        ),
        degraded=found.degraded,
    )


def explained_hit(verdict: Verdict, hit: Hit) -> schemas.ExplainedHit:
    fused = verdict.fused
    return schemas.ExplainedHit(
        id=hit.id,
        text=hit.text,
        score=round(fused.score, 6),
        fused_score=round(fused.score if fused.fused_score is None else fused.fused_score, 6),
        session_id=hit.session_id,
        seq=hit.seq,
        created_at=ms_to_datetime(hit.created_at_ms),
        kept=verdict.kept,
        reason=verdict.reason,
        dense_similarity=None if fused.similarity is None else round(fused.similarity, 6),
        dense_rank=verdict.dense_rank,
        keyword_score=None if fused.keyword_score is None else round(fused.keyword_score, 6),
        keyword_rank=verdict.keyword_rank,
        keyword_coverage=None if verdict.coverage is None else round(verdict.coverage, 6),
        in_timeframe=fused.in_timeframe,
    )


class VectorPass(NamedTuple):
    """What a pass that writes vectors from PostgreSQL did."""

    written: int
    unstorable: int
    """Memories skipped because no Milvus row can hold them (each pass meets and counts them again)."""


async def repair_vectors(stores: Stores, embed: EmbedMany, *, chunk: int = 256) -> VectorPass:
    """Give Milvus back every memory PostgreSQL holds and Milvus lacks (same text, same model,
    so the same vector), compared by the memories' keys under this code's key scheme. Idempotent,
    safe to run any time."""
    repaired = skipped = 0
    for tenant, user in await stores.keywords.users():
        ids = await stores.keywords.memory_ids(tenant, user)
        missing = sorted(await stores.vectors.missing(tenant, user, ids))
        written = 0
        for start in range(0, len(missing), chunk):
            hits, bad = _storable(tenant, user, await stores.keywords.fetch(tenant, user, missing[start : start + chunk]))
            skipped += bad
            written += len(await _write_vectors(stores, embed, tenant, user, hits))
        if written:
            logger.warning("repaired %d vectors of %.80r/%.80r that Milvus had lost", written, tenant, user)
        repaired += written
    return VectorPass(repaired, skipped)


async def reembed_vectors(stores: Stores, embed: EmbedMany, *, chunk: int = 256, max_chunks: int | None = None) -> VectorPass:
    """Embed again, under this code's document embedding, every memory an older one embedded.
    Resumable: each chunk is recorded once its vectors are written, so a restart goes on with the
    memories still stale."""
    done = skipped = chunks = 0
    while max_chunks is None or chunks < max_chunks:
        stale = await stores.keywords.embedded_before(limit=chunk)
        if not stale:
            break
        marked = 0
        for (tenant, user), group in itertools.groupby(stale, key=lambda item: (item[0], item[1])):
            hits, bad = _storable(tenant, user, [hit for _, _, hit in group])
            skipped += bad
            written = await _write_vectors(stores, embed, tenant, user, hits)
            marked += await stores.keywords.mark_embedded(tenant, user, list(written.values()))
        done += marked
        chunks += 1
        if not marked:  # each one changed or went meanwhile (its writer wrote it), or cannot be stored
            break
    if done:
        logger.info("embedded %d memories again under the current document embedding", done)
    return VectorPass(done, skipped)


async def move_vectors(stores: Stores, embed: EmbedMany, *, chunk: int = 256, max_chunks: int | None = None) -> VectorPass:
    """Write under this code's key scheme every memory whose vector an older scheme holds: the vector
    copied from the older collection where it is this code's embedding of the memory (no model call),
    embedded from PostgreSQL's text where it is not, or where that collection lacks it (lost, or
    replaced by another owner's memory of the same id). Resumable: each chunk is recorded once its
    vectors are written. Once a pass finds none left, the older collection is dropped."""
    done = skipped = chunks = 0
    after: tuple[str, str, str] | None = None
    while max_chunks is None or chunks < max_chunks:
        stale = await stores.keywords.keyed_before(after=after, limit=chunk)
        if not stale:
            await stores.vectors.drop_legacy()
            break
        last_tenant, last_user, last, _ = stale[-1]
        after = (last_tenant, last_user, last.id)
        for (tenant, user), group in itertools.groupby(stale, key=lambda item: (item[0], item[1])):
            group = list(group)
            hits, bad = _storable(tenant, user, [hit for _, _, hit, _ in group])
            skipped += bad
            current = {hit.id for _, _, hit, embedded_now in group if embedded_now}
            copied = await stores.vectors.legacy_vectors(tenant, user, [h.id for h in hits if h.id in current])
            written = await _write_vectors(stores, embed, tenant, user, hits, copied)
            done += await stores.keywords.mark_keyed(tenant, user, list(written.values()))
        chunks += 1
    if done:
        logger.info("moved the vectors of %d memories to keys scoped to their owners", done)
    return VectorPass(done, skipped)


def _storable(tenant: str, user: str, hits: list[Hit]) -> tuple[list[Hit], int]:
    """The memories a Milvus row can hold, and how many it cannot (logged: PostgreSQL keeps them)."""
    kept = []
    for hit in hits:
        why = unstorable(_vector_row(tenant, user, hit, []))
        if why is None:
            kept.append(hit)
        else:
            logger.warning("memory %.80r of %.80r/%.80r has no Milvus row: %s", hit.id, tenant, user, why)
    return kept, len(hits) - len(kept)


async def _write_vectors(
    stores: Stores, embed: EmbedMany, tenant: str, user: str, hits: list[Hit], known: dict[str, Vector] | None = None
) -> dict[str, Hit]:
    """Write the vectors of memories PostgreSQL holds (those in `known` as given, the others
    embedded); returns the memories as PostgreSQL holds them after the write, by id (their vectors
    are then their texts')."""
    if not hits:
        return {}
    known = known or {}
    fresh = [h for h in hits if h.id not in known]
    embedded = dict(zip([h.id for h in fresh], await embed([h.text for h in fresh]) if fresh else [], strict=True))
    rows = [_vector_row(tenant, user, h, known[h.id] if h.id in known else embedded[h.id]) for h in hits]
    await stores.vectors.upsert(rows)
    # A delete that ran between the fetch and the upsert took the row out of PostgreSQL: take this
    # copy out of Milvus too. A rewrite of the same id meanwhile: write it again.
    now = {h.id: h for h in await stores.keywords.fetch(tenant, user, [r.id for r in rows])}
    for row in rows:
        if row.id not in now:
            await stores.vectors.delete(tenant_id=tenant, user_id=user, id=row.id)
    changed = [now[r.id] for r in rows if r.id in now and now[r.id].text != r.text]
    if changed:
        again = await embed([h.text for h in changed])
        await stores.vectors.upsert([_vector_row(tenant, user, h, v) for h, v in zip(changed, again, strict=True)])
    return now


async def reindex_keywords(stores: Stores, settings: Settings, *, chunk: int = 500, max_chunks: int | None = None) -> int:
    """Index again, under this code's keyword analysis, every memory indexed with an older one;
    returns how many were. Resumable: each chunk commits with its rows' analysis stamp, so a restart
    goes on with the rows still stale. A memory indexed before its context was kept takes it from the
    turn memories before it in its session."""
    done = chunks = 0
    wanted = settings.recall_keyword_context_turns
    while max_chunks is None or chunks < max_chunks:
        stale = await stores.keywords.stale(limit=chunk)
        if not stale:
            break
        rows = []
        for (tenant, user), group in itertools.groupby(stale, key=lambda m: (m.row.tenant_id, m.row.user_id)):
            group = list(group)
            unknown = sorted({m.row.session_id for m in group if not m.context_known and m.row.kind == "turn"})
            turns = await stores.keywords.session_turns(tenant, user, unknown) if unknown else {}
            for memory in group:
                row = memory.row
                before = row.context
                if not memory.context_known:
                    earlier = [text for seq, text in turns.get(row.session_id, []) if seq < row.seq]
                    before = tuple(earlier[-wanted:]) if wanted and row.kind == "turn" else ()
                rows.append(
                    memory_row(
                        settings,
                        memory_id=row.id,
                        tenant=tenant,
                        user=user,
                        text=row.text,
                        created_at_ms=row.created_at_ms,
                        vector=[],
                        session=row.session_id,
                        seq=row.seq,
                        role=row.role,
                        kind=row.kind,
                        before=before,
                    )
                )
        done += await stores.keywords.reindex(rows)
        chunks += 1
    if done:
        logger.info("re-indexed the keywords of %d memories", done)
    return done


def _vector_row(tenant: str, user: str, hit: Hit, vector: Vector) -> MemoryRow:
    """The Milvus row of a memory PostgreSQL holds (its keyword text stays as indexed there)."""
    return MemoryRow(
        id=hit.id,
        tenant_id=tenant,
        user_id=user,
        session_id=hit.session_id,
        seq=hit.seq,
        role=hit.role,
        kind=hit.kind,
        text=hit.text,
        created_at_ms=hit.created_at_ms,
        vector=vector,
    )
