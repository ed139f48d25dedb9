"""Long turns as passages. Pure: no I/O.

A turn of thousands of characters (a plan, a pasted log, a review) says many things; one vector of
it is a blur of them all, and quoting it whole in a prompt spends a third of a small budget on one
memory. So a turn longer than `whole` characters is remembered as passages of about `target`
characters, cut at paragraph and sentence boundaries: each has its own vector and keyword entry and
knows its place in the turn, recall ranks passages, and the prompt quotes the ones that matter
(docs/architecture/recall.md). The session log still keeps the turn whole.

A passage's memory id is the turn's with its place appended (`<turn id>.p<part>-<parts>`), so a
retried memorization writes the same rows again and the place is read back from any hit.
"""

from __future__ import annotations

import re

_SENTENCE_END = re.compile(r"[.!?\u2026][\"')\]]*\s")
_PLACE = re.compile(r"\.p(\d+)-(\d+)$")


def split_passages(text: str, *, target: int = 600, whole: int = 1000) -> list[str]:
    """The turn as passages in order; a text of at most `whole` characters is one passage, itself.

    Each passage is a slice of the text (its line breaks and code kept) of at most `target`
    characters, ending where the writer paused: at the last paragraph break in the second half of
    its window, else the last line break, sentence end or space, else mid-word (a hash, a blob).
    The last passage takes a rest of up to a third more than `target`, so none is a stub."""
    if len(text) <= whole:
        return [text]
    passages: list[str] = []
    start, end = 0, len(text)
    while end - start > target + target // 3:
        cut = _cut(text, start + max(1, target // 2), start + target)
        passages.append(text[start:cut])
        start = cut
    passages.append(text[start:])
    return [p.strip() for p in passages if p.strip()]


def _cut(text: str, lo: int, hi: int) -> int:
    """Where to end a passage inside text[lo:hi]: after the strongest boundary, the latest of its kind."""
    for mark in ("\n\n", "\n"):
        at = text.rfind(mark, lo, hi)
        if at >= 0:
            return at + len(mark)
    ends = [m.end() for m in _SENTENCE_END.finditer(text, lo, hi)]
    if ends:
        return ends[-1]
    at = text.rfind(" ", lo, hi)
    return at + 1 if at >= 0 else hi


def passage_id(turn_id: str, part: int, parts: int) -> str:
    """The memory id of passage `part` (1-based) of `parts` of a turn."""
    return f"{turn_id}.p{part}-{parts}"


def turn_of(memory_id: str) -> str:
    """The turn's memory id of a passage's id; any other id as it is."""
    return _PLACE.sub("", memory_id)


def passage_place(memory_id: str) -> tuple[int, int] | None:
    """(part, parts) of a passage's memory id; None for a memory that is not a passage."""
    found = _PLACE.search(memory_id)
    if found is None:
        return None
    part, parts = int(found.group(1)), int(found.group(2))
    return (part, parts) if 1 <= part <= parts else None
