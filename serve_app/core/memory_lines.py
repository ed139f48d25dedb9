"""How recalled memories read in a prompt: few tokens, much said. Pure: no I/O.

Memories are chosen in rank order (the budget does that), but shown as a timeline: one group per
session and date, the date written once per group, turns in their order, and neighbouring turns of
one exchange in one bullet, so a reply ("Yes, last Tuesday!") sits under the question it answers.
Passages of one long turn (core/passages.py) are quoted in one bullet, in their order, under the
turn's role: neighbours read as one text, a gap between them is marked "…", and so is a turn that
goes on before or after what is quoted. A memory that says what a chosen one already says (the
same words, whatever their case, punctuation or spacing) is not shown twice.
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
    part: int = 0
    """A passage of a long turn: its place in the turn, from 1; 0 for a whole memory."""
    parts: int = 0
    speaker: str = ""
    """A passage: the turn's role."""
    body: str = ""
    """A passage: its text alone."""
    space: str = ""
    """The memory space it was recalled from ("": the user's own): its group's header names it."""

    @property
    def group(self) -> tuple[str, str, str]:
        return (self.day, self.space, self.session)


def passage_item(
    speaker: str, body: str, day: str, session: str, seq: int, part: int, parts: int, space: str = ""
) -> MemoryItem:
    """A passage as the prompt shows it when it is quoted alone."""
    return MemoryItem(quote(speaker, [(part, body)], parts), day, session, seq, "turn", part, parts, speaker, body, space)


def quote(speaker: str, passages: Sequence[tuple[int, str]], parts: int) -> str:
    """`speaker: text` of passages of one turn (part, body), in order: "…" where the turn goes on
    before, between or after them."""
    pieces = ["… "] if passages[0][0] > 1 else []
    for i, (part, body) in enumerate(passages):
        if i:
            pieces.append(" " if part == passages[i - 1][0] + 1 else " … ")
        pieces.append(body)
    if passages[-1][0] < parts:
        pieces.append(" …")
    return f"{speaker}: {''.join(pieces)}"


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


def said_key(item: MemoryItem) -> str:
    """The duplicate key of what a memory says, without the speaker a turn's line starts with."""
    if item.part:
        return duplicate_key(item.body)
    if item.kind == "turn":
        return duplicate_key(item.text.partition(": ")[2])
    return duplicate_key(item.text)


def group_header(day: str, space: str = "") -> str:
    return f"\n[{day}, space {space}]" if space else f"\n[{day}]"


def item_line(item: MemoryItem) -> str:
    return bullet(item.text)


def bullet(text: str) -> str:
    return f"\n- {text}"


_TIMELINE_ORDER = itemgetter(1, 9, 2, 3, 5)  # day, space, session, seq, part


def _same_turn(a: MemoryItem, b: MemoryItem) -> bool:
    return bool(a.part) and (a.day, a.space, a.session, a.seq, a.parts, a.speaker) == (
        b.day,
        b.space,
        b.session,
        b.seq,
        b.parts,
        b.speaker,
    )


def render(items: Sequence[MemoryItem]) -> str:
    """The memory section for these items (any order): groups by date, then session; turns in order."""
    if not items:
        return ""
    parts = [MEMORIES_HEADER]
    group: tuple[str, str] | None = None
    follows_from: tuple[str, int] | None = None  # (kind, seq) of the line before, in this group
    ordered = sorted(items, key=_TIMELINE_ORDER)
    i = 0
    while i < len(ordered):
        item = ordered[i]
        text, run = item.text, 1
        if item.part:  # the passages of this turn chosen with it, quoted together
            while i + run < len(ordered) and _same_turn(ordered[i + run], item):
                run += 1
            if run > 1:
                chosen = ordered[i : i + run]
                text = quote(item.speaker, [(p.part, p.body) for p in chosen], item.parts)
        if item.group != group:
            group, follows_from = item.group, None
            parts.append(group_header(item.day, item.space))
        parts.append(f"\n  {text}" if item.kind == "turn" and follows_from == ("turn", item.seq - 1) else bullet(text))
        follows_from = (item.kind, item.seq)
        i += run
    return "".join(parts)
