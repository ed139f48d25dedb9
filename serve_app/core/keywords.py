"""Keyword text for the BM25 side of recall: the same normalization for memories and queries.

Milvus Lite's analyzer only lowercases and splits (its stemmer and stop filters are ignored), so the
normalization happens here, identically for every Milvus: stop words out, Snowball English stems.
A memory's keyword text also carries its context (the turns just before it, the date) because a
short reply ("Yes, last Tuesday!") is only findable through what it answers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import date
from functools import lru_cache

import snowballstemmer

_WORD_RE = re.compile(r"\w+", re.UNICODE)
_STEMMER = snowballstemmer.stemmer("english")


@lru_cache(maxsize=1)
def stop_words() -> frozenset[str]:
    # scikit-learn's list (Glasgow IR group); imported lazily, it pulls scipy.
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    return frozenset(ENGLISH_STOP_WORDS)


def terms(text: str) -> list[str]:
    """Lowercased word tokens without stop words, stemmed."""
    stops = stop_words()
    return _STEMMER.stemWords([w for w in _WORD_RE.findall(text.lower()) if w not in stops])


def normalize(text: str) -> str:
    return " ".join(terms(text))


def day_words(day: date) -> str:
    """A date as words the query side can match ("8 may 2023"), written out before stop words apply."""
    return f"{day.day} {day.strftime('%B').lower()} {day.year}"


def memory_keywords(text: str, before: Sequence[str] = (), day: date | None = None, weight: int = 2) -> str:
    """Keyword text of one memory: its date, the turns before it, and its own text `weight` times
    (term frequency favours the memory over its context)."""
    parts = [normalize(t) for t in before] + [normalize(text)] * max(1, weight)
    head = day_words(day) if day else ""
    return " ".join(p for p in [head, *parts] if p)
