"""Request and response models of agent-memory-serve's API v1, as the client sends and reads them.

Each model is named as its schema in the service's `/openapi.json`; a test of the service compares
their fields with that document, so client and server cannot drift apart silently.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["system", "user", "assistant", "tool"]
FactCategory = Literal["preference", "fact", "decision", "task", "instruction"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")  # a newer server may answer with more


class ToolFunction(_Model):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(_Model):
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolFunction


class MessageIn(_Model):
    role: Role
    content: str = ""
    id: str | None = Field(None, description="Client message id; the client makes one when none is given.")
    created_at: datetime | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCall] | None = None


class AppendRequest(_Model):
    user_id: str
    messages: list[MessageIn]
    agent_id: str | None = None
    space: str | None = None


class AppendResponse(_Model):
    session_id: str
    seqs: list[int]
    duplicates: list[bool]


class SessionInfo(_Model):
    session_id: str
    user_id: str
    message_count: int
    covers_upto_seq: int
    memorized_upto_seq: int
    extracted_upto_seq: int
    remembered_upto_seq: int = 0
    """The checkpointed turns the session's summary memories cover."""
    summary_version: int
    summary_degraded: bool
    created_at: datetime
    updated_at: datetime


class StoredMessage(_Model):
    seq: int
    role: Role
    content: str
    id: str | None = None
    created_at: datetime | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    agent_id: str | None = None
    space: str | None = None


class MessagesPage(_Model):
    session_id: str
    messages: list[StoredMessage]
    summary: str
    covers_upto_seq: int
    next_after: int | None


class ToolResultIn(_Model):
    name: str = "tool"
    content: str


class BudgetShares(_Model):
    memory: float = 0.12
    history: float = 0.62
    tools: float = 0.12
    output: float = 0.06


class ContextRequestIn(_Model):
    user_id: str
    session_id: str
    query: str = ""
    system_prompt: str | None = None
    tool_results: list[ToolResultIn] = Field(default_factory=list)
    max_tokens: int | None = None
    reserve_output: int | None = None
    shares: BudgetShares | None = None
    top_k: int | None = None
    min_score: float | None = None
    min_probability: float | None = None
    spaces: list[str] = Field(default_factory=list)
    """Memory spaces recalled beside the user's own memory (a read grant on each)."""


class SectionUsage(_Model):
    tokens: int
    budget: int
    share: int = 0
    reason: Literal["mandatory", "all_fit", "room", "empty"] = "all_fit"


class ContextUsage(_Model):
    total_tokens: int
    max_tokens: int
    reserve_output: int
    limit: int
    omitted_turns: int
    percent_used: float
    sections: dict[str, SectionUsage]


class FactOut(_Model):
    key: str
    value: str
    category: FactCategory
    source_session: str | None
    source_seqs: list[int]
    valid_from: datetime
    valid_to: datetime | None
    agent_id: str | None = None
    added_by: str | None = None
    origin_user: str | None = None
    said_at: datetime | None = None
    space: str | None = None


class SearchHit(_Model):
    id: str
    text: str
    score: float
    """What the hits are ordered by: the second stage's probability (or the fused score with `recall_rerank` off)."""
    session_id: str
    seq: int
    created_at: datetime
    kind: str = "turn"
    """turn (said in a session), memory (added directly) or summary (a block of a session's compacted turns)."""
    part: int | None = None
    """A passage of a long turn: its place in the turn, from 1."""
    parts: int | None = None
    """A passage of a long turn: how many passages the turn has."""
    space: str | None = None
    """The memory space it was recalled from; None: the user's own."""
    agent_id: str | None = None


class ImportReport(_Model):
    user_id: str
    sessions: list[str] = []
    """The archive's sessions the user now holds; their turns' memories follow within a sweep or two."""
    renamed: dict[str, str] = {}
    """Sessions stored under another id (another user of the tenant holds theirs): archive id -> id."""
    messages_added: int = 0
    memories_written: int = 0
    facts_added: int = 0


class ContextResponse(_Model):
    messages: list[dict[str, Any]]
    usage: ContextUsage
    recalled: list[SearchHit]
    facts: list[FactOut]
    summary_included: bool
    included_seqs: list[int]
    degraded: list[str]
    standing: list[FactOut] = Field(default_factory=list)


class CompressResponse(_Model):
    session_id: str
    compacted: bool
    summary: str
    covers_upto_seq: int
    tokens_before: int
    tokens_after: int
    cas_conflicts: int
    degraded: bool = False


class UserSessions(_Model):
    user_id: str
    sessions: list[dict[str, Any]]


class FactIn(_Model):
    value: str
    category: FactCategory = "fact"
    source_session: str | None = None
    source_seqs: list[int] = Field(default_factory=list)
    agent_id: str | None = None


class FactWrite(_Model):
    fact: FactOut
    changed: bool


class MemoryIn(_Model):
    text: str
    id: str | None = None
    created_at: datetime | None = None
    agent_id: str | None = None


class MemoryOut(_Model):
    id: str
    text: str
    session_id: str
    seq: int
    role: str
    kind: str
    created_at: datetime
    agent_id: str | None = None
    added_by: str | None = None
    origin_user: str | None = None
    origin_memory: str | None = None


class SearchRequest(_Model):
    query: str
    top_k: int = 10
    min_score: float | None = None
    explain: bool = False
    spaces: list[str] = Field(default_factory=list)


class ExplainedHit(SearchHit):
    """A candidate of either search with what fusion and the second stage made of it: `score` is what
    the hits are ordered by, `fused_score` the fusion's."""

    role: str
    """Who said it: user or assistant for a turn, memory for one added directly."""
    fused_score: float
    kept: bool
    reason: str
    dense_similarity: float | None
    dense_rank: int | None
    keyword_score: float | None
    keyword_rank: int | None
    keyword_coverage: float | None
    in_timeframe: bool


class Floors(_Model):
    min_similarity: float
    min_keyword_share: float
    min_keyword_coverage: float
    related_similarity: float


class SearchExplained(_Model):
    hits: list[SearchHit]
    candidates: list[ExplainedHit]
    floors: Floors
    degraded: list[str]


class UserSummary(_Model):
    user_id: str
    memories: int
    facts: int


class UsersPage(_Model):
    users: list[UserSummary]
    next_after: str | None


class AuditEntry(_Model):
    id: int
    at: datetime
    actor: str
    via: str
    action: str
    target: dict[str, str]
    result: dict[str, int]


class AuditPage(_Model):
    entries: list[AuditEntry]
    next_before: int | None


class MemorizationStats(_Model):
    sessions_pending: int
    oldest_pending_s: float | None
    llm_sessions_due: int


class LLMStats(_Model):
    mode: str
    summary_fallbacks: int
    extraction_failures: int


class RecallStats(_Model):
    samples: int
    p50_ms: float | None
    p95_ms: float | None


class Stats(_Model):
    memories: int
    memorization: MemorizationStats
    llm: LLMStats
    recall: RecallStats


class SessionExport(_Model):
    session: SessionInfo
    summary: str
    messages: list[StoredMessage]
    memories: list[MemoryOut]


class Deleted(_Model):
    deleted: bool
    details: dict[str, int] = Field(default_factory=dict)


class Health(_Model):
    status: Literal["ok", "degraded"]
    backends: dict[str, str]


SpaceRole = Literal["read", "write", "admin"]


class SpaceIn(_Model):
    space_id: str
    quota_memories: int | None = None


class SpaceOut(_Model):
    space_id: str
    quota_memories: int
    created_by: str
    created_at: datetime
    role: SpaceRole | None
    memories: int = 0


class GrantIn(_Model):
    role: SpaceRole


class GrantOut(_Model):
    principal: str
    """The key as the audit log names it: `key:<first 12 hex of its SHA-256>`, or `local`."""
    role: SpaceRole
    granted_by: str
    granted_at: datetime


class PromoteIn(_Model):
    space: str
    agent_id: str | None = None


API_MODELS: tuple[type[BaseModel], ...] = (
    ToolFunction, ToolCall, MessageIn, AppendRequest, AppendResponse, SessionInfo, StoredMessage, MessagesPage,
    ToolResultIn, BudgetShares, ContextRequestIn, SectionUsage, ContextUsage, FactOut, SearchHit, ContextResponse,
    CompressResponse, UserSessions, FactIn, FactWrite, MemoryIn, MemoryOut, SearchRequest, Deleted, Health,
    ExplainedHit, Floors, SearchExplained, UserSummary, UsersPage, AuditEntry, AuditPage, MemorizationStats, LLMStats,
    RecallStats, Stats, SessionExport, ImportReport, SpaceIn, SpaceOut, GrantIn, GrantOut, PromoteIn,
)  # fmt: skip
"""Every model that mirrors a schema of the service's OpenAPI document, by the same name."""
