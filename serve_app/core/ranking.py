"""Hybrid recall ranking: weighted reciprocal-rank fusion of the dense and keyword lists, a boost for
memories from the time a query names, and a floor so that nothing irrelevant is forced into a prompt.

Pure: the stores hand in their ranked lists, this decides the order. Rank fusion needs no score
calibration between cosine similarity and BM25, which live on unrelated scales.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from serve_app.core.timeframe import Timeframe


@dataclass(frozen=True)
class FusionParams:
    dense_weight: float = 0.5
    keyword_weight: float = 1.0
    time_weight: float = 0.5
    rrf_k: float = 20.0
    min_similarity: float = 0.25
    """Dense floor: cosine similarity a memory needs to be recalled on meaning alone."""
    min_keyword_share: float = 0.3
    """Keyword floor: share of the best BM25 score of the query a memory needs to be recalled on words alone."""
    min_keyword_coverage: float = 0.0
    """Absolute keyword floor: share of the query's idf weight a memory must match. The share above is
    relative to the best match, so on its own it lets the best of any match in, however weak."""


@dataclass(frozen=True)
class Scored:
    id: str
    score: float
    created_at: datetime | None = None
    coverage: float | None = None
    """Keyword side: the share of the query's idf weight matched (None: not measured)."""


@dataclass(frozen=True)
class Fused:
    id: str
    score: float
    similarity: float | None
    keyword_score: float | None
    in_timeframe: bool


def _rrf(rank: int, weight: float, k: float) -> float:
    return weight / (k + rank + 1)


def fuse(
    dense: Sequence[Scored],
    keyword: Sequence[Scored],
    params: FusionParams = FusionParams(),
    timeframe: Timeframe | None = None,
    limit: int | None = None,
) -> list[Fused]:
    """Both lists best first. A memory survives the floors if its similarity passes, or its keyword
    score passes both keyword floors."""
    similarity = {s.id: s.score for s in dense}
    keyword_score = {s.id: s.score for s in keyword}
    coverage = {s.id: s.coverage for s in keyword if s.coverage is not None}
    created = {s.id: s.created_at for s in (*dense, *keyword) if s.created_at is not None}
    fused: dict[str, float] = {}
    for rank, item in enumerate(dense):
        fused[item.id] = fused.get(item.id, 0.0) + _rrf(rank, params.dense_weight, params.rrf_k)
    for rank, item in enumerate(keyword):
        fused[item.id] = fused.get(item.id, 0.0) + _rrf(rank, params.keyword_weight, params.rrf_k)
    in_window: set[str] = set()
    if timeframe is not None and params.time_weight > 0:
        in_window = {i for i, when in created.items() if when is not None and timeframe.contains(when)}
        for rank, item_id in enumerate(sorted(in_window, key=lambda i: -fused[i])):
            fused[item_id] += _rrf(rank, params.time_weight, params.rrf_k)
    best_keyword = max(keyword_score.values(), default=0.0)

    def passes(item_id: str) -> bool:
        if params.min_similarity <= -1:  # no floor asked for
            return True
        if similarity.get(item_id, -2.0) >= params.min_similarity:
            return True
        if coverage.get(item_id, 1.0) < params.min_keyword_coverage:
            return False
        return best_keyword > 0 and keyword_score.get(item_id, 0.0) >= params.min_keyword_share * best_keyword

    ranked = sorted((i for i in fused if passes(i)), key=lambda i: (-fused[i], i))
    return [Fused(i, fused[i], similarity.get(i), keyword_score.get(i), i in in_window) for i in ranked[: limit or len(ranked)]]
