"""How recalled memories read in a prompt: few tokens, much said. Pure: no I/O.

Memories are chosen in rank order (the budget does that), but shown as a timeline: one group per
session and date, the date written once per group, turns in their order, and neighbouring turns of
one exchange in one bullet, so a reply ("Yes, last Tuesday!") sits under the question it answers.
A memory that says what a chosen one already says (the same words, whatever their case,
punctuation or spacing) is not shown twice.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from functools import lru_cache
from operator import itemgetter
from typing import NamedTuple

MEMORIES_HEADER = "\n\n# Relevant memories from earlier conversations"
_PUNCTUATION_TO_SPACE = str.maketrans({c: " " for c in string.punctuation + "\u2018\u2019\u201c\u201d\u2026\u2013\u2014"})


class MemoryItem(NamedTuple):
    """One recalled memory as the prompt shows it: a named tuple, the cheapest immutable record
    to build, and a context builds one per recalled memory."""

    text: str
    """What the line says: `role: text` for a turn, the text for anything else."""
    day: str
    """ISO date of the memory, or "undated"."""
    session: str
    seq: int
    kind: str = "turn"

    @property
    def group(self) -> tuple[str, str]:
        return (self.day, self.session)


def duplicate_key(text: str) -> str:
    """The text as the near-duplicate check compares it: its lowercase words, in order (a translate
    table, not a regular expression, and cached: it runs for every recalled memory of every prompt,
    and a user's memories are recalled again and again; a long one is not kept for it)."""
    return _cached_duplicate_key(text) if len(text) <= CACHED_TEXT_CHARS else _words(text)


CACHED_TEXT_CHARS = 2048


@lru_cache(maxsize=8192)
def _cached_duplicate_key(text: str) -> str:
    return _words(text)


def _words(text: str) -> str:
    return " ".join(text.lower().translate(_PUNCTUATION_TO_SPACE).split())


def group_header(day: str) -> str:
    return f"\n[{day}]"


def item_line(item: MemoryItem) -> str:
    return bullet(item.text)


def bullet(text: str) -> str:
    return f"\n- {text}"


_TIMELINE_ORDER = itemgetter(1, 2, 3)  # day, session, seq


def render(items: Sequence[MemoryItem]) -> str:
    """The memory section for these items (any order): groups by date, then session; turns in order."""
    if not items:
        return ""
    parts = [MEMORIES_HEADER]
    group: tuple[str, str] | None = None
    follows_from: tuple[str, int] | None = None  # (kind, seq) of the line before, in this group
    for text, day, session, seq, kind in sorted(items, key=_TIMELINE_ORDER):
        if (day, session) != group:
            group, follows_from = (day, session), None
            parts.append(group_header(day))
        parts.append(f"\n  {text}" if kind == "turn" and follows_from == ("turn", seq - 1) else bullet(text))
        follows_from = (kind, seq)
    return "".join(parts)
