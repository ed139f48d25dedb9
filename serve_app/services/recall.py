"""Hybrid recall of one user's memories: keyword (BM25) and dense searches fused by rank.

The keyword search (PostgreSQL) starts first and runs while the query is embedded, so on the
critical path there is one embedding and one dense search (Milvus). Either side failing leaves the other side's answer,
named in `degraded`; both failing raises.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from serve_app.core.clock import ms_to_datetime
from serve_app.core.keywords import query_terms
from serve_app.core.ranking import FusionParams, Scored, Verdict, explain, fuse
from serve_app.core.records import Hit
from serve_app.core.rerank import reordered, rerank
from serve_app.core.timeframe import query_timeframe
from serve_app.encoding import EmbedOne
from serve_app.errors import RecallUnavailable
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores

logger = logging.getLogger("ray.serve")


@dataclass
class Recall:
    hits: list[Hit]
    degraded: list[str] = field(default_factory=list)
    verdicts: list[tuple[Verdict, Hit]] = field(default_factory=list)
    """With `explained`: every candidate with its memory, kept or not: in the hits' order (the second
    stage's, when on), then the ones the floors stopped, best fused score first."""


def fusion_params(settings: Settings, min_score: float | None = None) -> FusionParams:
    return FusionParams(
        dense_weight=settings.recall_dense_weight,
        keyword_weight=settings.recall_keyword_weight if settings.recall_hybrid else 0.0,
        time_weight=settings.recall_time_weight,
        rrf_k=settings.recall_rrf_k,
        min_similarity=settings.recall_min_score if min_score is None else min_score,
        min_keyword_share=settings.recall_min_keyword_share,
        min_keyword_coverage=settings.recall_min_keyword_coverage,
        related_similarity=settings.recall_related_similarity,
    )


async def recall(
    stores: Stores,
    embed_one: EmbedOne,
    tenant: str,
    user: str,
    query: str,
    *,
    top_k: int,
    settings: Settings,
    min_score: float | None = None,
    observe_ms: Callable[[float], None] | None = None,
    explained: bool = False,
    shared: Sequence[str] = (),
) -> Recall:
    """The best `top_k` memories, each scored by fusion; `observe_ms` gets the time it took.
    `explained` also judges every candidate (`Recall.verdicts`): the same floors, the same order.
    `shared`: owner ids of spaces (core.spaces) read beside the user's own memories, already
    granted: every store query is scoped to exactly these owners, and each hit names its owner."""
    if top_k <= 0 or not query.strip():
        return Recall([])
    started = time.perf_counter()
    candidates = max(settings.recall_candidates, top_k)
    terms = query_terms(query) if settings.recall_hybrid else ""
    owners = [user, *shared]
    keyword_search = _keyword_of_owners(stores, tenant, owners, terms, candidates) if shared else None
    keyword_task = (
        asyncio.create_task(keyword_search or stores.keywords.search(tenant, user, terms, limit=candidates)) if terms else None
    )
    owner_of: dict[str, str] = {}

    async def dense_side() -> list[tuple[str, float, int]]:
        vector = await embed_one(query)
        if not shared:
            return await stores.vectors.search_dense_ids(tenant, user, vector, limit=candidates)
        found = await stores.vectors.search_dense_ids_of(tenant, owners, vector, limit=candidates)
        owner_of.update((memory_id, owner) for memory_id, _, _, owner in found)
        return [(memory_id, similarity, created) for memory_id, similarity, created, _ in found]

    degraded: list[str] = []
    dense: list[tuple[str, float, int]] = []
    keyword: list[Hit] = []
    try:
        dense = await dense_side()
    except Exception as exc:
        logger.warning("dense recall unavailable: %r", exc)
        degraded.append("dense_recall_unavailable")
    if keyword_task is not None:
        try:
            keyword = await keyword_task
        except Exception as exc:
            logger.warning("keyword recall unavailable: %r", exc)
            degraded.append("keyword_recall_unavailable")
    if len(degraded) == 1 + (keyword_task is not None):
        raise RecallUnavailable(", ".join(degraded))
    timeframe = query_timeframe(query)

    def when(ms: int) -> datetime | None:  # only a query that names a time looks at the memories' dates
        return ms_to_datetime(ms) if timeframe is not None else None

    dense_scored = [Scored(memory_id, similarity, when(created)) for memory_id, similarity, created in dense]
    keyword_scored = [Scored(h.id, h.score, when(h.created_at_ms), h.coverage) for h in keyword]
    params = fusion_params(settings, min_score)
    # The second stage orders every kept candidate, so the cut to top_k comes after it.
    cut = None if settings.recall_rerank else top_k
    verdicts = explain(dense_scored, keyword_scored, params, timeframe, limit=cut) if explained else []
    if explained:
        fused = [v.fused for v in verdicts if v.kept]
    else:
        fused = fuse(dense_scored, keyword_scored, params, timeframe, limit=cut)
    details = {h.id: h for h in keyword}
    wanted = [v.fused.id for v in verdicts] if explained else [f.id for f in fused]
    missing = [i for i in wanted if i not in details]
    if shared:
        by_owner: dict[str, list[str]] = {}
        for memory_id in missing:
            by_owner.setdefault(owner_of.get(memory_id, user), []).append(memory_id)
        for owner, ids in by_owner.items():
            for hit in await _details(stores, tenant, owner, ids):
                hit.owner = owner
                details[hit.id] = hit
    else:
        details |= {h.id: h for h in await _details(stores, tenant, user, missing)}
    if settings.recall_rerank:
        # A memory deleted between the search and the fetch is simply left out.
        ranked = rerank([f for f in fused if f.id in details], dense_scored, keyword_scored, details, settings.rerank_model())
        if explained:
            verdicts = reordered(verdicts, ranked, top_k)
        fused = ranked[:top_k]
    if observe_ms is not None:
        observe_ms((time.perf_counter() - started) * 1000)
    # The hits are this request's own objects: scored in place (dataclasses.replace cost more than
    # the fusion).
    hits = []
    for f in fused:
        if (hit := details.get(f.id)) is not None:
            hit.score = round(f.score, 6)
            hits.append(hit)
    judged = [(v, details[v.fused.id]) for v in verdicts if v.fused.id in details]
    return Recall(hits, degraded, judged)


async def _keyword_of_owners(stores: Stores, tenant: str, owners: list[str], terms: str, limit: int) -> list[Hit]:
    """The keyword candidates of several owners: each owner's BM25 over its own statistics (as a
    search of that owner alone scores it), merged best first. Each hit names its owner."""
    found = await asyncio.gather(*(stores.keywords.search(tenant, owner, terms, limit=limit) for owner in owners))
    merged = []
    for owner, hits in zip(owners, found, strict=True):
        for hit in hits:
            hit.owner = owner
            merged.append(hit)
    merged.sort(key=lambda h: (-h.score, h.id))
    return merged[:limit]


async def _details(stores: Stores, tenant: str, user: str, ids: list[str]) -> list[Hit]:
    """Text and origin of dense-only winners: from the keyword index, what it lacks from Milvus."""
    if not ids:
        return []
    found: list[Hit] = []
    try:
        found = await stores.keywords.fetch(tenant, user, ids)
    except Exception as exc:
        logger.warning("keyword index unavailable for details, reading Milvus: %r", exc)
    if len(found) < len(ids):  # a write that reached Milvus first, or PostgreSQL down
        have = {h.id for h in found}
        found += await stores.vectors.fetch(tenant, user, [i for i in ids if i not in have])
    return found
