"""A memory's sentences, for embedding it sentence by sentence as well as whole. Pure.

The embedding model was trained on sentence pairs. A turn that says three things in three sentences
comes out of one pass as a blur of them, so the vector a memory is stored under adds the mean of its
sentences' vectors to the whole text's (encoding/sentence.py), and a question about any one of the
three finds it (docs/architecture/recall.md).
"""

from __future__ import annotations

import re

MAX_SENTENCES = 32
"""Sentences embedded per memory at most (the first ones): a long text's cost stays bounded."""
_BOUNDARY = re.compile(r"(?<=[.!?\u2026])\s+|\s*\n\s*")
"""After a sentence's closing mark and the white space that follows it, and at every line break."""


def sentences(text: str) -> list[str]:
    """The text's sentences in order, at most MAX_SENTENCES, empty pieces dropped; a text of one
    sentence gives one (itself, stripped)."""
    return [piece for piece in (p.strip() for p in _BOUNDARY.split(text)) if piece][:MAX_SENTENCES]
