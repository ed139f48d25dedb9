"""Second-stage ranking of the fused candidates: a logistic model over what recall already knows of
each candidate, no model call and no extra round trip.

Rank fusion weighs every candidate by its two ranks alone. The model also sees how far a candidate
is from each side's best score, how much of the query its words cover, how long it is (a bare
"Thanks!" rarely answers anything), how many better-fused candidates share its session, and who
said it: what a user asks about later is more often what they said than what an assistant wrote
around it, and an assistant's long answers, cut into many passages, would otherwise crowd the
list. Its weights come from `bench.rerank_fit`, fitted on short conversations and long ones
together (leave-one-conversation-out figures: docs/benchmarks/rerank_fit.md); the score it gives is
the model's probability that a candidate is evidence for the query, so scores and order agree.

Pure: recall hands in the fused list, both sides' lists and each candidate's session, role and
text; this returns the new order.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Protocol

import numpy as np

from serve_app.core.ranking import Fused, Scored, Verdict

FEATURES = (
    "fused",  # fused score over the best fused score of the list
    "similarity",  # cosine minus the dense side's best (the side's worst for a keyword-only candidate)
    "dense_rank",  # 1 / (RANK_K + rank) on the dense side, 0 when absent
    "keyword_share",  # BM25 over the keyword side's best, 0 when absent
    "keyword_rank",  # 1 / (RANK_K + rank) on the keyword side, 0 when absent
    "coverage",  # share of the query's idf weight its words match, 0 when absent
    "length",  # log(1 + characters of its text)
    "session_above",  # log(1 + better-fused candidates from the same session)
    "user_turn",  # 1 for what the user said, 0 for the assistant's turns and anything else
)
RANK_K = 20.0


@dataclass(frozen=True)
class RerankModel:
    """Standardised logistic regression, logit = bias + sum(weight * (x - mean) / scale), over each
    feature held to the range it had in the fitting data (`low`..`high`): the model says nothing
    about values it never saw, such as a memory ten times longer than any turn it was fitted on."""

    mean: tuple[float, ...]
    scale: tuple[float, ...]
    weight: tuple[float, ...]
    bias: float
    low: tuple[float, ...]
    high: tuple[float, ...]

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> RerankModel:
        """A model as `to_dict` wrote it; one fitted on other features than FEATURES is refused."""
        if list(data.get("features", ())) != list(FEATURES):
            wanted = ", ".join(FEATURES)
            raise ValueError(f"a second-stage model must be fitted on the features {wanted}; got {data.get('features')}")
        vectors = {name: tuple(float(v) for v in data[name]) for name in ("mean", "scale", "weight", "low", "high")}
        for name, values in vectors.items():
            if len(values) != len(FEATURES):
                raise ValueError(f"a second-stage model's {name} needs {len(FEATURES)} values, got {len(values)}")
        if any(v <= 0 for v in vectors["scale"]):
            raise ValueError("a second-stage model's scales must be positive")
        return cls(**vectors, bias=float(data["bias"]))

    @classmethod
    def from_file(cls, path: str | Path) -> RerankModel:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def to_dict(self) -> dict[str, object]:
        return {"features": list(FEATURES), **asdict(self)}

    @cached_property
    def _arrays(self) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
        """The same logit as intercept + coefficients . features, the features clipped to low..high."""
        coefficients = np.array(self.weight) / np.array(self.scale)
        intercept = self.bias - float(coefficients @ np.array(self.mean))
        return coefficients, intercept, np.array(self.low), np.array(self.high)

    def probabilities(self, rows: Sequence[Sequence[float]]) -> list[float]:
        """The probability of each row (a candidate's FEATURES), all rows in one array operation:
        the second stage scores every kept candidate of every recall."""
        if not len(rows):
            return []
        coefficients, intercept, low, high = self._arrays
        logits = np.clip(np.clip(np.asarray(rows, dtype=np.float64), low, high) @ coefficients + intercept, -500.0, 500.0)
        return (1.0 / (1.0 + np.exp(-logits))).tolist()  # clipped: exp overflows past about 709


LENGTH = FEATURES.index("length")
LONG_LIST_CHARS = 300
"""A list of candidates whose median memory is at least this long is ranked by the long model."""


@dataclass(frozen=True)
class SecondStage:
    """Two models of the same features: one fitted on lists of short memories (chat turns), one on
    lists of long ones (the passages of long turns and the turns among them). Which one ranks a
    list is read from the list itself, its median text length: a user whose memories are plans and
    pasted logs is ranked by the model that learnt from such, and one who chats in a line or two by
    the other, with neither fit bent to serve both."""

    short: RerankModel
    long: RerankModel

    @staticmethod
    def is_long(rows: Sequence[Sequence[float]]) -> bool:
        """Whether a list's median memory is long (`LONG_LIST_CHARS`); its rows hold `length`."""
        if not len(rows):
            return False
        lengths = sorted(row[LENGTH] for row in rows)
        return lengths[len(lengths) // 2] >= math.log1p(LONG_LIST_CHARS)

    def model_for(self, rows: Sequence[Sequence[float]]) -> RerankModel:
        return self.long if self.is_long(rows) else self.short

    def probabilities(self, rows: Sequence[Sequence[float]]) -> list[float]:
        return self.model_for(rows).probabilities(rows)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> SecondStage:
        """Both models as `to_dict` wrote them, or one model (as older files hold) for both kinds."""
        if "short" in data and "long" in data:
            return cls(RerankModel.from_dict(data["short"]), RerankModel.from_dict(data["long"]))  # type: ignore[arg-type]
        model = RerankModel.from_dict(data)
        return cls(model, model)

    @classmethod
    def from_file(cls, path: str | Path) -> SecondStage:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def to_dict(self) -> dict[str, object]:
        return {"short": self.short.to_dict(), "long": self.long.to_dict()}


# Fitted by `python -m bench.rerank_fit ../shared/data/locomo --candidates BEAM-CANDIDATES` on the three LoCoMo
# development files and the twelve long conversations of shared/data/beam (docs/benchmarks/rerank_fit.md).
SHIPPED_SHORT = RerankModel(
    mean=(0.337955, -0.156869, 0.018799, 0.2258, 0.013336, 0.184993, 4.814669, 0.897381, 0.505997),
    scale=(0.224322, 0.07235, 0.013921, 0.293944, 0.015793, 0.270041, 0.59916, 0.721831, 0.499964),
    weight=(0.784321, 0.255632, 0.326534, 0.95581, -0.391753, 0.137653, 0.837738, 0.176941, 0.030299),
    bias=-5.916979,
    low=(0.075, -0.478551, 0.0, 0.0, 0.0, 0.0, 2.197225, 0.0, 0.0),
    high=(1.0, 0.0, 0.05, 1.0, 0.05, 1.0, 6.098074, 3.258097, 1.0),
)
SHIPPED_LONG = RerankModel(
    mean=(0.264026, -0.191906, 0.010937, 0.369153, 0.01115, 0.279525, 6.153162, 2.289793, 0.263979),
    scale=(0.195403, 0.087504, 0.011983, 0.32593, 0.011981, 0.283938, 0.432317, 1.043621, 0.440788),
    weight=(-0.366309, 0.19493, 0.66431, 0.063913, 1.38789, -0.339856, 0.14363, 0.721902, 0.84726),
    bias=-4.952269,
    low=(0.058338, -0.539372, 0.0, 0.0, 0.0, 0.0, 4.007333, 0.0, 0.0),
    high=(1.0, 0.0, 0.05, 1.0, 0.05, 1.0, 7.186901, 4.70953, 1.0),
)
SHIPPED_MODEL = SecondStage(SHIPPED_SHORT, SHIPPED_LONG)


class Described(Protocol):
    """What the stores say of a candidate beyond its scores (a `records.Hit` is one)."""

    session_id: str
    text: str
    role: str


def features(
    fused: Sequence[Fused], dense: Sequence[Scored], keyword: Sequence[Scored], about: Mapping[str, Described]
) -> list[tuple[float, ...]]:
    """One row of FEATURES per fused candidate, in the fused order; every candidate needs `about`."""
    best_fused = fused[0].score if fused and fused[0].score > 0 else 1.0
    similarities = [s.score for s in dense]
    best_similarity = max(similarities, default=0.0)
    worst_similarity = min(similarities, default=0.0)
    best_keyword = max((s.score for s in keyword), default=0.0) or 1.0
    dense_rank = {s.id: r for r, s in enumerate(dense)}
    keyword_rank = {s.id: r for r, s in enumerate(keyword)}
    coverage = {s.id: s.coverage or 0.0 for s in keyword}
    above: dict[str, int] = {}
    rows = []
    for candidate in fused:
        facts = about[candidate.id]
        seen = above.get(facts.session_id, 0)
        above[facts.session_id] = seen + 1
        similarity = worst_similarity if candidate.similarity is None else candidate.similarity
        rows.append(
            (
                candidate.score / best_fused,
                similarity - best_similarity,
                1.0 / (RANK_K + dense_rank[candidate.id]) if candidate.id in dense_rank else 0.0,
                (candidate.keyword_score or 0.0) / best_keyword,
                1.0 / (RANK_K + keyword_rank[candidate.id]) if candidate.id in keyword_rank else 0.0,
                coverage.get(candidate.id, 0.0),
                math.log1p(len(facts.text)),
                math.log1p(seen),
                1.0 if facts.role == "user" else 0.0,
            )
        )
    return rows


def rerank(
    fused: Sequence[Fused],
    dense: Sequence[Scored],
    keyword: Sequence[Scored],
    about: Mapping[str, Described],
    model: RerankModel | SecondStage = SHIPPED_MODEL,
) -> list[Fused]:
    """The candidates best first by the model's probability, which becomes their score (the fused
    score stays in `fused_score`); equal probabilities keep the fused order."""
    rows = features(fused, dense, keyword, about)
    scored = sorted(zip(model.probabilities(rows), range(len(rows)), fused, strict=True), key=lambda item: (-item[0], item[1]))
    return [
        Fused(c.id, probability, c.similarity, c.keyword_score, c.in_timeframe, fused_score=c.score)
        for probability, _, c in scored
    ]


def reordered(verdicts: Sequence[Verdict], ranked: Sequence[Fused], limit: int) -> list[Verdict]:
    """`explain`'s verdicts in the second stage's order: the ranked candidates first, those past
    `limit` marked `beyond_limit`, then the ones the floors stopped (or that were gone by the
    fetch), in the fused order."""
    by_id = {v.fused.id: v for v in verdicts}
    out = [
        replace(by_id[f.id], fused=f, kept=i < limit, reason=by_id[f.id].reason if i < limit else "beyond_limit")
        for i, f in enumerate(ranked)
    ]
    placed = {f.id for f in ranked}
    return out + [v for v in verdicts if v.fused.id not in placed]
