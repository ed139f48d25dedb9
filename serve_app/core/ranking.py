"""Hybrid recall ranking: weighted reciprocal-rank fusion of the dense and keyword lists, a boost for
memories from the time a query names, and a floor so that nothing irrelevant is forced into a prompt.

Pure: the stores hand in their ranked lists, this decides the order. Rank fusion needs no score
calibration between cosine similarity and BM25, which live on unrelated scales.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from serve_app.core.timeframe import Timeframe


@dataclass(frozen=True)
class FusionParams:
    dense_weight: float = 0.5
    keyword_weight: float = 1.0
    time_weight: float = 0.5
    rrf_k: float = 20.0
    min_similarity: float = 0.3
    """Dense floor: cosine similarity a memory needs to be recalled on meaning alone."""
    min_keyword_share: float = 0.3
    """Keyword floor: share of the best BM25 score of the query a memory needs to be recalled on words alone."""
    min_keyword_coverage: float = 0.0
    """Absolute keyword floor: share of the query's idf weight a memory must match. The share above is
    relative to the best match, so on its own it lets the best of any match in, however weak."""
    related_similarity: float = 2.0
    """A query whose nearest memory (the dense side's best cosine) has at least this is about the
    user's memories: the coverage floor, there to give a question about something else nothing,
    is not applied to it, and its weaker keyword matches are left to the second stage to order.
    Above 1: the coverage floor applies to every query."""


class Scored(NamedTuple):
    """One side's candidate. A named tuple, like `Fused`: a recall builds one per candidate of each
    side, and a tuple is built for a fraction of a frozen dataclass's cost."""

    id: str
    score: float
    created_at: datetime | None = None
    coverage: float | None = None
    """Keyword side: the share of the query's idf weight matched (None: not measured)."""


class Fused(NamedTuple):
    id: str
    score: float
    similarity: float | None
    keyword_score: float | None
    in_timeframe: bool
    fused_score: float | None = None
    """Set by a second-stage ranking (core/rerank.py), whose score replaces `score`: the fusion's own."""


def _rrf(rank: int, weight: float, k: float) -> float:
    return weight / (k + rank + 1)


@dataclass(frozen=True)
class Verdict:
    """Why a candidate is in or out: `reason` is how it passed the floors (`similarity`, `keywords`,
    `no_floor`) or which floor stopped it (`similarity_floor`, `keyword_coverage_floor`,
    `keyword_share_floor`); a candidate that passed but ranked past the limit says `beyond_limit`."""

    fused: Fused
    kept: bool
    reason: str
    dense_rank: int | None
    keyword_rank: int | None
    coverage: float | None


@dataclass
class _Table:
    fused: dict[str, float]
    similarity: dict[str, float]
    keyword_score: dict[str, float]
    coverage: dict[str, float]
    in_window: set[str]
    best_keyword: float
    related: bool
    """The query is about the user's memories (`FusionParams.related_similarity`)."""


def _table(dense: Sequence[Scored], keyword: Sequence[Scored], params: FusionParams, timeframe: Timeframe | None) -> _Table:
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
    related = max(similarity.values(), default=-1.0) >= params.related_similarity
    return _Table(fused, similarity, keyword_score, coverage, in_window, max(keyword_score.values(), default=0.0), related)


def _floors(table: _Table, item_id: str, params: FusionParams) -> tuple[bool, str]:
    """(passes, reason): the similarity floor lets a memory in on meaning; otherwise both keyword
    floors must let it in on words (the coverage floor only for a query not about the user's
    memories)."""
    if params.min_similarity <= -1:  # no floor asked for
        return True, "no_floor"
    if table.similarity.get(item_id, -2.0) >= params.min_similarity:
        return True, "similarity"
    if item_id not in table.keyword_score:
        return False, "similarity_floor"
    if not table.related and table.coverage.get(item_id, 1.0) < params.min_keyword_coverage:
        return False, "keyword_coverage_floor"
    if table.best_keyword > 0 and table.keyword_score[item_id] >= params.min_keyword_share * table.best_keyword:
        return True, "keywords"
    return False, "keyword_share_floor"


def _fused(table: _Table, item_id: str) -> Fused:
    return Fused(
        item_id,
        table.fused[item_id],
        table.similarity.get(item_id),
        table.keyword_score.get(item_id),
        item_id in table.in_window,
    )


def fuse(
    dense: Sequence[Scored],
    keyword: Sequence[Scored],
    params: FusionParams = FusionParams(),
    timeframe: Timeframe | None = None,
    limit: int | None = None,
) -> list[Fused]:
    """Both lists best first. A memory survives the floors if its similarity passes, or its keyword
    score passes both keyword floors."""
    table = _table(dense, keyword, params, timeframe)
    ranked = sorted((i for i in table.fused if _floors(table, i, params)[0]), key=lambda i: (-table.fused[i], i))
    return [_fused(table, i) for i in ranked[: limit or len(ranked)]]


def explain(
    dense: Sequence[Scored],
    keyword: Sequence[Scored],
    params: FusionParams = FusionParams(),
    timeframe: Timeframe | None = None,
    limit: int | None = None,
) -> list[Verdict]:
    """Every candidate of `fuse`, kept or not, best fused score first, with the reason: the same
    floors and order as `fuse`, whose result is exactly the kept ones."""
    table = _table(dense, keyword, params, timeframe)
    dense_rank = {s.id: r for r, s in enumerate(dense)}
    keyword_rank = {s.id: r for r, s in enumerate(keyword)}
    verdicts: list[Verdict] = []
    kept = 0
    for item_id in sorted(table.fused, key=lambda i: (-table.fused[i], i)):
        passes, reason = _floors(table, item_id, params)
        if passes and limit and kept >= limit:
            passes, reason = False, "beyond_limit"
        kept += passes
        verdicts.append(
            Verdict(
                _fused(table, item_id),
                passes,
                reason,
                dense_rank.get(item_id),
                keyword_rank.get(item_id),
                table.coverage.get(item_id),
            )
        )
    return verdicts
