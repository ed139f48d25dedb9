"""The memory API: add, list, delete and search one user's long-term memories, and the shapes the
API shows them in. Writes and deletes go through `memory_writes`, so both indexes take them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from pydantic import TypeAdapter

from serve_app import schemas
from serve_app.core.clock import datetime_to_ms, ms_to_datetime
from serve_app.core.ids import direct_memory_id
from serve_app.core.ranking import Verdict
from serve_app.core.records import Hit
from serve_app.core.spaces import space_of
from serve_app.errors import InvalidRequest, MemoryNotFound
from serve_app.runtime import tracing
from serve_app.services.dependencies import Dependencies
from serve_app.services.memory_writes import DIRECT, Provenance, delete_memories, memory_row, save_memories
from serve_app.services.quota import check_memory_quota
from serve_app.services.recall import Recall, fusion_params, recall
from serve_app.stores.vectors import MAX_RESULT_WINDOW

SEARCH_HITS = TypeAdapter(list[schemas.SearchHit])


def _place(hit: Hit) -> dict[str, int]:
    place = hit.place
    return {"part": place[0], "parts": place[1]} if place is not None else {}


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
                "kind": hit.kind,
                "space": space_of(hit.owner) if hit.owner else None,
                "agent_id": hit.agent_id,
                **_place(hit),
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
        agent_id=hit.agent_id,
        added_by=hit.added_by,
        origin_user=hit.origin_user,
        origin_memory=hit.origin_memory,
    )


async def add_memory(
    deps: Dependencies, tenant: str, user_id: str, body: schemas.MemoryIn, *, added_by: str | None = None
) -> schemas.MemoryOut:
    """A memory stated directly (not memorized from a turn); the same text added twice is stored once.
    `user_id` is an owner id: a user's, or a space's (core.spaces) once its quota was checked."""
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
        provenance=Provenance(agent_id=body.agent_id, added_by=added_by),
    )
    await save_memories(deps.stores, [row])
    return schemas.MemoryOut(
        id=memory_id,
        text=body.text,
        session_id="",
        seq=0,
        role=DIRECT,
        kind=DIRECT,
        created_at=created,
        agent_id=body.agent_id,
        added_by=added_by,
    )


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
    deps: Dependencies, tenant: str, user_id: str, body: schemas.SearchRequest, shared: Sequence[str] = ()
) -> list[schemas.SearchHit] | schemas.SearchExplained:
    """`shared`: owner ids of the granted spaces searched beside the user's memories."""
    attributes = {"memory.operation": "search", "memory.tenant": tenant, "memory.user": user_id}
    if shared:
        attributes["memory.spaces"] = [space_of(owner) or owner for owner in shared]
    with tracing.span("memory.search", attributes=attributes) as span:
        found = await _search(deps, tenant, user_id, body, shared)
        if span.is_recording():
            span.set_attributes({"memory.recalled": len(found.hits), "memory.degraded": found.degraded})
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
            related_similarity=params.related_similarity,
        ),
        degraded=found.degraded,
    )


async def _search(deps: Dependencies, tenant: str, user_id: str, body: schemas.SearchRequest, shared: Sequence[str]) -> Recall:
    return await recall(
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
        shared=shared,
    )


def explained_hit(verdict: Verdict, hit: Hit) -> schemas.ExplainedHit:
    fused = verdict.fused
    return schemas.ExplainedHit(
        id=hit.id,
        text=hit.text,
        score=round(fused.score, 6),
        fused_score=round(fused.score if fused.fused_score is None else fused.fused_score, 6),
        role=hit.role,
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
        space=space_of(hit.owner) if hit.owner else None,
        agent_id=hit.agent_id,
    )
