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
from dataclasses import dataclass
from functools import lru_cache

MEMORIES_HEADER = "\n\n# Relevant memories from earlier conversations"
_PUNCTUATION_TO_SPACE = str.maketrans({c: " " for c in string.punctuation + "\u2018\u2019\u201c\u201d\u2026\u2013\u2014"})


@dataclass(frozen=True)
class MemoryItem:
    """One recalled memory as the prompt shows it."""

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
    return f"\n- {item.text}"


def render(items: Sequence[MemoryItem]) -> str:
    """The memory section for these items (any order): groups by date, then session; turns in order."""
    if not items:
        return ""
    groups: dict[tuple[str, str], list[MemoryItem]] = {}
    for item in items:
        groups.setdefault(item.group, []).append(item)
    ordered = sorted(groups.values(), key=lambda members: members[0].group)
    parts = [MEMORIES_HEADER]
    for members in ordered:
        parts.append(group_header(members[0].day))
        previous: MemoryItem | None = None
        for item in sorted(members, key=lambda m: m.seq):
            follows = previous is not None and item.kind == previous.kind == "turn" and item.seq == previous.seq + 1
            parts.append(f"\n  {item.text}" if follows else item_line(item))
            previous = item
    return "".join(parts)
