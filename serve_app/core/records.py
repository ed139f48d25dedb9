"""The shapes long-term memory takes between stores and services. Pure data.

`MemoryRow` is what is written (to Milvus and to the keyword index alike); `Hit` is what a search
or a fetch returns from either of them. `FactCategory` is the one list of fact categories: the API,
the extraction prompt and schema, and the facts store all read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal, get_args

from serve_app.core.ids import MAX_ID_LENGTH
from serve_app.core.passages import passage_place

FactCategory = Literal["preference", "fact", "decision", "task", "instruction"]
FACT_CATEGORIES: tuple[str, ...] = get_args(FactCategory)
MAX_TEXT_BYTES = 16000  # the longest memory text kept (the Milvus schema's VARCHAR bound)
MAX_LABEL_BYTES = 16  # a memory's role and kind ("assistant", "memory", ...)


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
    agent_id: str | None = None
    """Provenance (PostgreSQL only): the agent that wrote it, from the request."""
    added_by: str | None = None
    """Provenance: the key that added it directly or promoted it (as the audit log names keys)."""
    origin_user: str | None = None
    """A copy promoted into a space: the user it came from (forgetting that user removes it)."""
    origin_memory: str | None = None
    """A copy promoted into a space: the memory it was copied from."""


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
    owner: str = ""
    """Where it was recalled from when a search reads spaces too: its owner id (core.spaces)."""
    agent_id: str | None = None
    added_by: str | None = None
    origin_user: str | None = None
    origin_memory: str | None = None

    @cached_property
    def place(self) -> tuple[int, int] | None:
        """(part, parts) of a passage of a long turn (core/passages.py); None for a whole memory.
        Cached: a context reads it per hit several times (the history check, the prompt line, the
        API's hit)."""
        return passage_place(self.id) if self.kind == "turn" else None


def unstorable(row: MemoryRow) -> str | None:
    """Why a memory does not fit the vector store's fields, or None when it does. PostgreSQL holds
    text of any length, so a row written there before the API bounded ids as the other stores do
    can exceed them; the text is clipped to fit, never refused."""
    for field, value, limit in (
        ("id", row.id, MAX_ID_LENGTH),
        ("tenant_id", row.tenant_id, MAX_ID_LENGTH),
        ("user_id", row.user_id, MAX_ID_LENGTH),
        ("session_id", row.session_id, MAX_ID_LENGTH),
        ("role", row.role, MAX_LABEL_BYTES),
        ("kind", row.kind, MAX_LABEL_BYTES),
    ):
        size = len(value.encode("utf-8", errors="surrogatepass"))
        if size > limit:
            return f"{field} of {size} bytes (at most {limit})"
    return None
