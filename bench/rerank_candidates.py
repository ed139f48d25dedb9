"""Long conversations' candidates for `bench.rerank_fit`: each question's explained search, as
`bench.beam --candidates` wrote it over HTTP from a service that ingested the conversation, turned
into the second stage's features exactly as the service computes them (`rerank.features`).

The service's explained search gives every candidate of either side with its dense similarity and
rank, its BM25 score, rank and coverage, its fused score and whether the floors passed it: the
lists `rerank.features` reads are rebuilt from those. A candidate's label is whether the message it
is of (a passage: the message the passage is of) is a source of the question; recall@k counts
distinct messages, as bench.beam does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from serve_app.core.ranking import Fused, Scored
from serve_app.core.rerank import RerankModel, SecondStage, features


@dataclass
class Question:
    sources: frozenset[int]
    fused: list[Fused]
    messages: dict[str, int | None]
    rows: list[tuple[float, ...]]

    @property
    def labels(self) -> list[bool]:
        return [self.messages[f.id] in self.sources for f in self.fused]


@dataclass
class LongConversation:
    """One conversation's questions: a held-out unit of `bench.rerank_fit`."""

    name: str
    questions: list[Question]


def question_of(line: dict) -> Question:
    candidates = line["candidates"]
    dense = sorted((c for c in candidates if c["dense_rank"] is not None), key=lambda c: c["dense_rank"])
    keyword = sorted((c for c in candidates if c["keyword_rank"] is not None), key=lambda c: c["keyword_rank"])
    passed = sorted((c for c in candidates if c["passed"]), key=lambda c: -c["fused_score"])
    fused = [Fused(c["id"], c["fused_score"], c["dense_similarity"], c["keyword_score"], c["in_timeframe"]) for c in passed]
    about = {c["id"]: SimpleNamespace(session_id=c["session_id"], text=c["text"], role=c["role"]) for c in candidates}
    rows = features(
        fused,
        [Scored(c["id"], c["dense_similarity"], None) for c in dense],
        [Scored(c["id"], c["keyword_score"], None, c["keyword_coverage"]) for c in keyword],
        about,
    )
    return Question(frozenset(line["sources"]), fused, {c["id"]: c["message"] for c in candidates}, rows)


def load(paths: Sequence[Path]) -> list[LongConversation]:
    """The conversations of `bench.beam --candidates` files, in the order first seen."""
    by_name: dict[str, LongConversation] = {}
    for path in paths:
        for text in path.read_text().splitlines():
            if text.strip():
                line = json.loads(text)
                name = f"beam-{line['conversation']}"
                by_name.setdefault(name, LongConversation(name, [])).questions.append(question_of(line))
    return list(by_name.values())


def distinct_recall(order: Sequence[int | None], sources: frozenset[int], k: int) -> float:
    seen: list[int] = []
    for message in order:
        if message is not None and message not in seen:
            seen.append(message)
    return len(sources & set(seen[:k])) / len(sources)


def recall_rows(conversation: LongConversation, model: RerankModel | SecondStage, ks: Sequence[int]) -> list[dict]:
    """Per question: recall@k over distinct messages in the fusion's order and the model's."""
    out = []
    for q in conversation.questions:
        probabilities = model.probabilities(q.rows)
        reranked = [
            f for _, _, f in sorted(zip(probabilities, range(len(q.fused)), q.fused, strict=True), key=lambda t: (-t[0], t[1]))
        ]
        out.append(
            {
                "category": "long conversations",
                "fusion": [distinct_recall([q.messages[f.id] for f in q.fused], q.sources, k) for k in ks],
                "reranked": [distinct_recall([q.messages[f.id] for f in reranked], q.sources, k) for k in ks],
            }
        )
    return out
