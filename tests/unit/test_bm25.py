"""BM25 summed per memory over posting arrays (core.bm25), against BM25 written out term by term."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.core.bm25 import BM25_B, BM25_K1, PostingList, best_documents, idf


def _lists(postings: dict[str, dict[int, tuple[int, int]]], n: int) -> list[PostingList]:
    return [
        PostingList(
            idf(len(held), n),
            np.array(list(held), dtype=np.int32),
            np.array([tf for tf, _ in held.values()], dtype=np.int32),
            np.array([length for _, length in held.values()], dtype=np.int32),
        )
        for held in postings.values()
    ]


def _by_hand(postings: dict[str, dict[int, tuple[int, int]]], n: int, avgdl: float) -> dict[int, float]:
    scores: dict[int, float] = {}
    for held in postings.values():
        weight = idf(len(held), n)
        for doc, (tf, length) in held.items():
            part = weight * tf * (BM25_K1 + 1) / (tf + BM25_K1 * (1 - BM25_B + BM25_B * length / avgdl))
            scores[doc] = scores.get(doc, 0.0) + part
    return scores


def test_a_memory_holding_the_rarer_term_more_often_ranks_first():
    postings = {"kiln": {0: (1, 10), 3: (3, 10)}, "ghent": {0: (1, 10), 1: (1, 10), 2: (1, 10), 3: (1, 10)}}
    ranked = best_documents(_lists(postings, 4), avgdl=10.0, limit=2)
    assert ranked.docs.tolist() == [3, 0]
    expected = _by_hand(postings, 4, 10.0)
    assert ranked.scores.tolist() == [expected[3], expected[0]]
    assert ranked.matched_idf.tolist() == [idf(2, 4) + idf(4, 4)] * 2


def test_every_memory_tied_at_the_cut_is_kept_for_the_caller_to_order_by_id():
    postings = {"lamp": {doc: (1, 5) for doc in range(6)}}
    ranked = best_documents(_lists(postings, 6), avgdl=5.0, limit=2)
    assert ranked.docs.tolist() == list(range(6))  # all equal: all kept, by number


def test_nothing_held_or_nothing_asked_is_empty():
    assert len(best_documents([], 3.0, 10).docs) == 0
    empty = PostingList(1.0, np.empty(0, np.int32), np.empty(0, np.int32), np.empty(0, np.int32))
    assert len(best_documents([empty], 3.0, 10).docs) == 0
    assert len(best_documents(_lists({"a": {1: (1, 2)}}, 2), 2.0, 0).docs) == 0


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["a", "b", "c", "d", "e"]),
        st.dictionaries(st.integers(0, 40), st.tuples(st.integers(1, 4), st.integers(1, 12)), min_size=1),
        min_size=1,
    ),
    st.integers(1, 50),
)
def test_the_best_are_bm25_written_out_term_by_term(postings, limit):
    n = 41
    avgdl = 6.5
    expected = _by_hand(postings, n, avgdl)
    ranked = best_documents(_lists(postings, n), avgdl, limit)
    # Ordered by id among equal scores, cut at `limit`, these are the best `limit` written out.
    got = sorted(zip(ranked.scores.tolist(), ranked.docs.tolist(), strict=True), key=lambda p: (-p[0], p[1]))[:limit]
    want = sorted(((s, d) for d, s in expected.items()), key=lambda p: (-p[0], p[1]))[:limit]
    assert [d for _, d in got] == [d for _, d in want]
    assert all(math.isclose(g, w, rel_tol=1e-12) for (g, _), (w, _) in zip(got, want, strict=True))
    # Nothing below the cut is handed back, but for ties with it.
    cut = want[-1][0]
    assert all(score >= cut - 1e-9 * max(1.0, cut) for score in ranked.scores.tolist())
