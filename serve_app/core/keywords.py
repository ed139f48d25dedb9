"""Keyword text for the BM25 side of recall: the same analysis for memories and queries. Pure.

Milvus Lite's analyzer only lowercases and splits (its stemmer and stop filters are ignored), so the
analysis happens here, identically for every store: stop words out, Snowball English stems (through
PyStemmer's C code when it is installed, the same stems as snowballstemmer's pure Python).
A memory's keyword text also carries its context (the turns just before it, the date) because a
short reply ("Yes, last Tuesday!") is only findable through what it answers.

Dates meet dates: a month named as a date ("8 May 2023", "July 7th", "in May") becomes one month
term on both sides, an ordinal ("7th") its number. Months that are also words ("may", "march",
"august") count as months only beside a number or, capitalized, after a word that introduces a
time ("in May", "early March"), so "you may go" stays a stop word and "we march on" a verb.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Sequence
from datetime import date

import snowballstemmer

from serve_app.core.stop_words import ENGLISH_STOP_WORDS

ANALYSIS_VERSION = 2
"""Bumped whenever `terms` changes what it returns: stored keyword text of an older analysis is
rebuilt by the memorizer (`services/index_repair.reindex_keywords`)."""

_WORD_RE = re.compile(r"\w+", re.UNICODE)
_STEMMER = snowballstemmer.stemmer("english")

_MONTHS = {name.lower(): number for number, name in enumerate(calendar.month_name) if name}
_MONTHS |= {name.lower(): number for number, name in enumerate(calendar.month_abbr) if name}
_MONTHS["sept"] = 9
_ALWAYS_MONTHS = {name for name, number in _MONTHS.items() if len(name) > 3 and name not in ("march", "august")}
_MONTH_RE = re.compile(r"\b(" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\b\.?", re.IGNORECASE)
_DAY_BEFORE_RE = re.compile(r"\b\d{1,2}(?:st|nd|rd|th)?\s+(?:of\s+)?$", re.IGNORECASE)
_NUMBER_AFTER_RE = re.compile(r"^,?\s+\d")
_TIME_WORD_BEFORE_RE = re.compile(
    r"\b(?:in|on|during|since|until|till|by|from|to|of|last|next|this|early|late|mid|every|through)\s+$", re.IGNORECASE
)
_ORDINAL_RE = re.compile(r"\b(\d{1,2})(?:st|nd|rd|th)\b", re.IGNORECASE)


def month_term(month: int) -> str:
    """The one term a month is indexed and queried by (a token no word stems to)."""
    return f"month_{month:02d}"


def _is_month(text: str, match: re.Match[str]) -> bool:
    word = match.group(1)
    if word.lower() in _ALWAYS_MONTHS:
        return True
    before, after = text[max(0, match.start() - 24) : match.start()], text[match.end() : match.end() + 4]
    if _DAY_BEFORE_RE.search(before) or _NUMBER_AFTER_RE.match(after):
        return True
    return word[0].isupper() and bool(_TIME_WORD_BEFORE_RE.search(before))


def _dates_as_terms(text: str) -> str:
    text = _MONTH_RE.sub(lambda m: f" {month_term(_MONTHS[m.group(1).lower()])} " if _is_month(text, m) else m.group(0), text)
    return _ORDINAL_RE.sub(r"\1", text)


def terms(text: str) -> list[str]:
    """Lowercased word tokens without stop words, stemmed; dates as day, month and year terms."""
    words = _WORD_RE.findall(_dates_as_terms(text).lower())
    return _STEMMER.stemWords([w for w in words if w not in ENGLISH_STOP_WORDS])


def normalize(text: str) -> str:
    return " ".join(terms(text))


def day_words(day: date) -> str:
    """A memory's date as the terms a query names it by: day, month term and year."""
    return f"{day.day} {month_term(day.month)} {day.year}"


def memory_keywords(text: str, before: Sequence[str] = (), day: date | None = None, weight: int = 2) -> str:
    """Keyword text of one memory: its date, the turns before it, and its own text `weight` times
    (term frequency favours the memory over its context)."""
    parts = [normalize(t) for t in before] + [normalize(text)] * max(1, weight)
    head = day_words(day) if day else ""
    return " ".join(p for p in [head, *parts] if p)
