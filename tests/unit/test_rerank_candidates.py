"""bench/rerank_candidates.py: a long conversation's explained search turned into the second
stage's features and labels, and recall over distinct messages in either order."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.rerank_candidates import LongConversation, distinct_recall, question_of, recall_rows
from serve_app.core.rerank import FEATURES, SHIPPED_MODEL


def _candidate(ident: str, message: int | None, *, fused: float, dense_rank=None, keyword_rank=None, passed=True, role="user"):
    return {
        "id": ident,
        "text": "x" * 40,
        "session_id": "s1",
        "seq": 1,
        "role": role,
        "fused_score": fused,
        "dense_similarity": None if dense_rank is None else 0.9 - 0.1 * dense_rank,
        "dense_rank": dense_rank,
        "keyword_score": None if keyword_rank is None else 10.0 - keyword_rank,
        "keyword_rank": keyword_rank,
        "keyword_coverage": None if keyword_rank is None else 0.5,
        "in_timeframe": False,
        "message": message,
        "passed": passed,
    }


LINE = {
    "conversation": "7",
    "question": "q",
    "sources": [2],
    "candidates": [
        _candidate("a.p1-2", 1, fused=0.05, dense_rank=0, role="assistant"),
        _candidate("a.p2-2", 1, fused=0.04, keyword_rank=0, role="assistant"),
        _candidate("b", 2, fused=0.03, dense_rank=1, keyword_rank=1),
        _candidate("c", 3, fused=0.01, dense_rank=2, passed=False),
    ],
}


def test_only_the_candidates_the_floors_passed_are_ranked_in_the_fusions_order_with_their_labels():
    q = question_of(LINE)
    assert [f.id for f in q.fused] == ["a.p1-2", "a.p2-2", "b"]
    assert q.labels == [False, False, True]
    rows = [dict(zip(FEATURES, row, strict=True)) for row in q.rows]
    assert [r["user_turn"] for r in rows] == [0.0, 0.0, 1.0]
    assert rows[0]["fused"] == 1.0 and rows[2]["dense_rank"] == pytest.approx(1 / 21)
    assert rows[1]["similarity"] == pytest.approx(0.7 - 0.9)  # keyword-only: the dense side's worst, c's


def test_recall_counts_distinct_messages_in_each_order():
    assert distinct_recall([1, 1, 2], frozenset({2}), 2) == 1.0
    assert distinct_recall([1, None, 3, 2], frozenset({2, 3}), 2) == 0.5
    only_user = replace(SHIPPED_MODEL.short, weight=tuple(5.0 if name == "user_turn" else 0.0 for name in FEATURES))
    (row,) = recall_rows(LongConversation("beam-7", [question_of(LINE)]), only_user, (1,))
    assert row["fusion"] == [0.0] and row["reranked"] == [1.0]
