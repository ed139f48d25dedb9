"""BM25 summed per memory over the query terms' posting lists, in arrays.

A query's terms are held by tens of thousands of one user's memories at 100k; summing their
postings per memory is most of a keyword search. PostgreSQL does it a row at a time through its
executor; here each term's list arrives as arrays (memory numbers, term frequencies, lengths) and
is added to every memory's score at once. Pure: the keyword index reads the lists, this scores them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BM25_K1 = 1.2
BM25_B = 0.75
SCORE_DIGITS = 9
"""Scores are compared to this many places: equal scores go by memory id."""
TIE_TOLERANCE = 10.0**-SCORE_DIGITS
"""Scores this close to the cut are kept for the caller to order by memory id: the same terms
summed in another order differ in the last bits, and a tie must not be broken by that."""


def idf(df: float, n: float) -> float:
    """BM25's inverse document frequency of a term that `df` of `n` memories hold."""
    return math.log(1 + (n - df + 0.5) / (df + 0.5))


@dataclass(frozen=True)
class PostingList:
    """One query term's postings in one user's memories: its idf and, per memory holding it, the
    memory's number, the term's frequency in it and the memory's length in terms."""

    idf: float
    docs: np.ndarray
    tfs: np.ndarray
    lengths: np.ndarray


@dataclass(frozen=True)
class Ranked:
    """Memories by number, best first, with their BM25 score and the idf of the query terms they hold."""

    docs: np.ndarray
    scores: np.ndarray
    matched_idf: np.ndarray


def best_documents(lists: Sequence[PostingList], avgdl: float, limit: int, *, k1: float = BM25_K1, b: float = BM25_B) -> Ranked:
    """The memories scoring at least the `limit`-th best score, best first (ties by number). Every
    memory within `TIE_TOLERANCE` of the cut is kept, so the caller can order ties by memory id and
    cut at `limit` exactly as one SQL statement ordering by score then id would."""
    held = [p for p in lists if len(p.docs)]
    if limit <= 0 or not held:
        empty = np.empty(0)
        return Ranked(empty.astype(np.int64), empty, empty)
    size = max(int(p.docs.max()) for p in held) + 1
    scores = np.zeros(size)
    matched = np.zeros(size)
    for p in held:
        # Each memory holds a term once: one list adds to each memory at most once, by assignment.
        tfs = p.tfs.astype(np.float64)
        scores[p.docs] += p.idf * (k1 + 1) * tfs / (tfs + (k1 * (1 - b) + (k1 * b / avgdl) * p.lengths))
        matched[p.docs] += p.idf
    present = np.flatnonzero(matched)  # every idf is positive: a memory holding a term has matched > 0
    if len(present) > limit:
        cut = np.partition(scores[present], len(present) - limit)[len(present) - limit]
        present = present[scores[present] >= cut - TIE_TOLERANCE * max(1.0, abs(cut))]
    order = np.lexsort((present, -scores[present]))
    chosen = present[order]
    return Ranked(chosen, scores[chosen], matched[chosen])
