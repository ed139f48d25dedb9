"""Keyword text for the BM25 side of recall: the same analysis for memories and queries. Pure.

Milvus Lite's analyzer only lowercases and splits (its stemmer and stop filters are ignored), so the
analysis happens here, identically for every store: stop words out, Snowball English stems (through
PyStemmer's C code when it is installed, the same stems as snowballstemmer's pure Python).
A memory's keyword text also carries its context (the turns just before it, the date) because a
short reply ("Yes, last Tuesday!") is only findable through what it answers. Only the end of each
turn before it: a reply answers what was said last, and a reply after an answer of thousands of
characters would otherwise be indexed as that answer, found by all its words and outweighed by its
length (BM25 normalizes by it).

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

ANALYSIS_VERSION = 3
"""Bumped whenever a memory's keyword text changes for the same memory (what `terms` returns, how
its context enters it): stored keyword text of an older analysis is rebuilt by the memorizer
(`services/index_repair.reindex_keywords`) from the text and context PostgreSQL keeps."""
CONTEXT_CHARS = 300
"""Characters of each turn before a memory that its keyword text carries (the turn's end): a short
turn whole, a long one's last few sentences (`recall_keyword_context_chars`)."""

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
_LEADING_WORD_RE = re.compile(r"^\w+")


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


_QUERY_FORM_WORDS = (
    "did does mention mentioned mentions conversation conversations discuss discussed discussion discussions "
    "brought bring say said told talk talked remind remember recap summary summarize summarise overview"
)
QUERY_FORM_TERMS = frozenset(terms(_QUERY_FORM_WORDS))
"""Terms a question uses to ask about the conversation itself ("did I mention", "in our
conversations", "summarize what we discussed") rather than name what it was about. They are rare
in what people say, so they weigh heavily in a query's idf and in the share of it a memory must
cover, while no memory answers them."""


def query_terms(text: str) -> str:
    """A query's keyword text: its terms without `QUERY_FORM_TERMS`, unless nothing else is left."""
    found = terms(text)
    return " ".join([t for t in found if t not in QUERY_FORM_TERMS] or found)


def day_words(day: date) -> str:
    """A memory's date as the terms a query names it by: day, month term and year."""
    return f"{day.day} {month_term(day.month)} {day.year}"


def context_tail(text: str, chars: int = CONTEXT_CHARS) -> str:
    """The last `chars` characters of a turn before a memory, starting at a word (a word the cut
    falls inside is left out whole)."""
    if len(text) <= chars:
        return text
    tail = text[-chars:]
    if text[-chars - 1].isalnum() and tail[:1].isalnum():
        tail = _LEADING_WORD_RE.sub("", tail, count=1)
    return tail


def memory_keywords(
    text: str, before: Sequence[str] = (), day: date | None = None, weight: int = 2, context_chars: int = CONTEXT_CHARS
) -> str:
    """Keyword text of one memory: its date, the end of each turn before it (`context_tail`), and
    its own text `weight` times (term frequency favours the memory over its context)."""
    parts = [normalize(context_tail(t, context_chars)) for t in before] + [normalize(text)] * max(1, weight)
    head = day_words(day) if day else ""
    return " ".join(p for p in [head, *parts] if p)
