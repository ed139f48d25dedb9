"""The shapes long-term memory takes between stores and services. Pure data.

`MemoryRow` is what is written (to Milvus and to the keyword index alike); `Hit` is what a search
or a fetch returns from either of them. `FactCategory` is the one list of fact categories: the API,
the extraction prompt and schema, and the facts store all read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

FactCategory = Literal["preference", "fact", "decision", "task"]
FACT_CATEGORIES: tuple[str, ...] = get_args(FactCategory)
MAX_TEXT_BYTES = 16000  # the longest memory text kept (the Milvus schema's VARCHAR bound)


def clip_utf8(text: str, limit: int) -> str:
    """At most `limit` bytes of UTF-8, never cutting a character in two."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", errors="ignore")


@dataclass
class MemoryRow:
    id: str
    tenant_id: str
    user_id: str
    session_id: str
    seq: int
    role: str
    kind: str
    text: str
    created_at_ms: int
    vector: list[float]
    keywords: str = ""
    """Normalized keyword text (`core.keywords.memory_keywords`); empty = the text's own terms."""
    context: tuple[str, ...] = ()
    """The turns just before a turn memory, as its keyword text carries them (kept for re-analysis)."""


@dataclass
class Hit:
    id: str
    text: str
    score: float
    session_id: str
    seq: int
    role: str
    kind: str
    created_at_ms: int
    coverage: float | None = None
    """Keyword hits: the share of the query's idf weight the memory's terms match (0-1)."""
