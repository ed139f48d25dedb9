"""HTTP API v1 request and response models: the service's boundary, validated strictly."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from serve_app.core.budget import BudgetShares, Reason
from serve_app.core.ids import ID_PATTERN, MAX_ID_LENGTH
from serve_app.core.records import FactCategory
from serve_app.core.spaces import MAX_SPACES_PER_REQUEST, SPACE_PATTERN
from serve_app.core.spaces import Role as SpaceRole

MAX_CONTENT_BYTES = 64 * 1024
MAX_MESSAGES_PER_REQUEST = 100
Role = Literal["system", "user", "assistant", "tool"]


def _id(description: str) -> Any:
    """An id field (it ends up in store keys and filters: bounded, `ID_PATTERN`) that says what it names."""
    return Field(pattern=ID_PATTERN, min_length=1, max_length=MAX_ID_LENGTH, description=description)


MAX_SEQ = 2**63 - 1  # seqs are BIGINT in PostgreSQL


def _storable(value: str) -> str:
    """Text every store can keep: PostgreSQL text refuses NUL, and a lone surrogate (a JSON "\\ud800"
    escape with no pair) has no UTF-8 form at all, so Redis, PostgreSQL and Milvus would all fail on it
    (a 500, or a turn the memorizer can never write). Such text is refused here, with a 422."""
    if "\x00" in value:
        raise ValueError("text must not contain NUL (\\u0000) characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"text is not valid Unicode: unpaired surrogate at character {exc.start}") from None
    return value


StorableText = Annotated[str, AfterValidator(_storable)]


def _within_content_limit(value: str) -> str:
    if len(value.encode("utf-8")) > MAX_CONTENT_BYTES:
        raise ValueError(f"content is larger than {MAX_CONTENT_BYTES} bytes")
    return value


BoundedText = Annotated[StorableText, AfterValidator(_within_content_limit)]
Seq = Annotated[int, Field(ge=0, le=MAX_SEQ)]
SpaceName = Annotated[str, Field(pattern=SPACE_PATTERN, description="A memory space of the caller's tenant.")]
AgentId = Annotated[str, Field(pattern=ID_PATTERN, max_length=MAX_ID_LENGTH)]


def _agent() -> Any:
    return Field(None, description="The agent that writes it (its provenance; optional).")


def _spaces(description: str) -> Any:
    return Field(default_factory=list, max_length=MAX_SPACES_PER_REQUEST, description=description)


def _representable_instant(value: datetime | None) -> datetime | None:
    """Naive means UTC. The instant must exist in UTC (`9999-12-31T23:59-14:00` does not) and survive the
    stores' epoch milliseconds and back (the last day of 9999 can round into year 10000, a 500 on read);
    the offset the client sent is kept."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    try:
        year = value.astimezone(UTC).year
    except (OverflowError, ValueError):
        year = 0
    if not 1 <= year <= 9998:
        raise ValueError("created_at must fall within the years 0001-9998 in UTC")
    return value


Instant = Annotated[datetime, AfterValidator(_representable_instant)]


def _json_storable(value: Any, path: str = "arguments") -> None:
    """Free-form JSON (tool arguments): the same text rule as `StorableText`, and finite numbers only."""
    if isinstance(value, str):
        try:
            _storable(value)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{path}: numbers must be finite (not NaN or Infinity)")
    elif isinstance(value, dict):
        for key, item in value.items():
            _json_storable(key, path)
            _json_storable(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _json_storable(item, f"{path}[{index}]")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


MAX_JSON_DEPTH = 16


def _depth(value: Any, level: int = 0) -> int:
    if level > MAX_JSON_DEPTH:
        return level
    if isinstance(value, dict):
        return max([_depth(v, level + 1) for v in value.values()], default=level + 1)
    if isinstance(value, list):
        return max([_depth(v, level + 1) for v in value], default=level + 1)
    return level


class ToolFunction(Strict):
    name: StorableText = Field(min_length=1, max_length=256, description="Name of the function the model called.")
    arguments: StorableText | dict[str, Any] = Field("{}", description="Its arguments: a JSON object, or its text.")

    @field_validator("arguments")
    @classmethod
    def _not_too_deep(cls, value: str | dict[str, Any]) -> str | dict[str, Any]:
        if isinstance(value, dict):
            if _depth(value) > MAX_JSON_DEPTH:
                raise ValueError(f"tool arguments are nested too deep (more than {MAX_JSON_DEPTH} levels)")
            _json_storable(value)
        return value


class ToolCall(Strict):
    id: StorableText | None = Field(None, max_length=128, description="Id the tool's result answers (its tool_call_id).")
    type: Literal["function"] = Field("function", description="Always function.")
    function: ToolFunction = Field(description="The function called and its arguments.")


class MessageIn(Strict):
    role: Role = Field(description="Who spoke: user, assistant, tool (a tool's result) or system.")
    content: StorableText = Field(
        "", description="The text of the turn, stored whole: any length the request body holds (max_body_bytes)."
    )
    id: str | None = Field(None, pattern=ID_PATTERN, description="Client message id: a retry with the same id is stored once.")
    created_at: Instant | None = Field(None, description="When the turn happened (naive = UTC); defaults to now.")
    name: StorableText | None = Field(None, max_length=128, description="Name of the speaker or the tool.")
    tool_call_id: StorableText | None = Field(None, max_length=128, description="A tool message: the call it answers.")
    tool_calls: list[ToolCall] | None = Field(None, max_length=32, description="An assistant message: the tools it called.")

    @model_validator(mode="after")
    def _tool_fields(self) -> MessageIn:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.tool_call_id and self.role != "tool":
            raise ValueError("only tool messages carry tool_call_id")
        return self

    def stored(self, now: datetime) -> dict[str, Any]:
        """The JSON object kept in the session log."""
        data = self.model_dump(exclude_none=True, mode="json")
        data["created_at"] = (self.created_at or now).isoformat()
        if self.tool_calls:
            for call in data["tool_calls"]:
                if isinstance(call["function"]["arguments"], dict):
                    call["function"]["arguments"] = json.dumps(call["function"]["arguments"], ensure_ascii=False)
        return data


class AppendRequest(Strict):
    user_id: str = _id("User the session belongs to.")
    messages: list[MessageIn] = Field(
        min_length=1, max_length=MAX_MESSAGES_PER_REQUEST, description="The new turns, oldest first."
    )
    agent_id: AgentId | None = _agent()
    space: SpaceName | None = Field(
        None,
        description="Memory space these turns are memorized into instead of the user's own memory (write grant needed); "
        "the session log stays the user's.",
    )


class AppendResponse(BaseModel):
    session_id: str
    seqs: list[int] = Field(description="Stored seq of each message, in request order.")
    duplicates: list[bool] = Field(description="True where the client id was already stored (original seq returned).")


class SessionInfo(BaseModel):
    session_id: str
    user_id: str
    message_count: int
    covers_upto_seq: int
    memorized_upto_seq: int
    extracted_upto_seq: int
    remembered_upto_seq: int = Field(
        0, description="The checkpointed turns the session's summary memories cover (follows covers_upto_seq)."
    )
    summary_version: int
    summary_degraded: bool
    created_at: datetime
    updated_at: datetime


class StoredMessage(BaseModel):
    seq: int
    role: Role
    content: str
    id: str | None = None
    created_at: datetime | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    agent_id: str | None = None
    space: str | None = Field(None, description="The memory space the turn is memorized into; null: the user's own.")


class MessagesPage(BaseModel):
    session_id: str
    messages: list[StoredMessage]
    summary: str
    covers_upto_seq: int
    next_after: int | None = Field(description="Pass as `after` for the next page; null at the end.")


class ToolResultIn(Strict):
    name: StorableText = Field("tool", max_length=128, description="The tool that produced it.")
    content: BoundedText = Field(description="The result's text (at most 64 KiB).")


class ContextRequestIn(Strict):
    user_id: str = _id("User whose memories and facts are recalled.")
    spaces: list[SpaceName] = _spaces(
        "Memory spaces recalled beside the user's own memories and facts (read grant needed); the prompt names the space of each."
    )
    session_id: str = _id("Session whose summary and recent turns go in.")
    query: StorableText = Field("", max_length=8192, description="Drives recall; not stored.")
    system_prompt: StorableText | None = Field(None, max_length=65536, description="Goes first, always whole.")
    tool_results: list[ToolResultIn] = Field(
        default_factory=list, max_length=32, description="Results of tool calls to put in the prompt (not stored)."
    )
    max_tokens: int | None = Field(
        None, ge=256, le=1_048_576, description="The model's window for this call (default default_max_tokens)."
    )
    reserve_output: int | None = Field(
        None, ge=0, le=1_048_576, description="Tokens kept free for the answer (default: the output share)."
    )
    shares: BudgetShares | None = Field(None, description="Each section's share of max_tokens (default: the service's).")
    top_k: int | None = Field(
        None,
        ge=0,
        le=100,
        description="The most memories this prompt takes (default recall_top_k); below it the floors and the room decide.",
    )
    min_score: float | None = Field(
        None, ge=-1, le=1, description="Dense similarity floor; default the service's recall_min_score, -1 = no floor."
    )
    min_probability: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Least chance of answering the query, by the second stage, a memory needs to enter the prompt "
        "(default context_min_probability; 0 = no floor).",
    )


class SectionUsage(BaseModel):
    tokens: int = Field(description="Exact tokens the section holds.")
    budget: int = Field(description="Tokens it was granted: its share plus what other sections left to it.")
    share: int = Field(0, description="Tokens of its share of max_tokens (0: the section has no share).")
    reason: Reason = Field(
        "all_fit",
        description="mandatory: always whole; all_fit: everything it had went in; room: its grant ran out first; "
        "empty: nothing to put in.",
    )


class ContextUsage(BaseModel):
    total_tokens: int = Field(description="Exact Qwen2.5 prompt tokens of `messages`, generation prompt included.")
    max_tokens: int
    reserve_output: int
    limit: int
    omitted_turns: int = Field(description="Unsummarized turns that did not fit.")
    percent_used: float
    sections: dict[str, SectionUsage]


class FactOut(BaseModel):
    key: str
    value: str
    category: FactCategory
    source_session: str | None
    source_seqs: list[int]
    valid_from: datetime
    valid_to: datetime | None
    agent_id: str | None = Field(None, description="The agent that wrote it.")
    added_by: str | None = Field(None, description="The key that wrote or promoted it, as the audit log names keys.")
    origin_user: str | None = Field(None, description="A fact promoted into a space: the user it came from.")
    said_at: datetime | None = Field(
        None,
        description="When the user said it (its source turn's time), for a fact the memorizer found in a turn; "
        "valid_from is when it was written. Standing rules are dated and ordered by it in the prompt.",
    )
    space: str | None = Field(None, description="A space's fact in a context: the space.")


class Pong(BaseModel):
    ok: bool = True


class SearchHit(BaseModel):
    """A recalled memory, from search or inside a context."""

    id: str
    text: str
    score: float = Field(
        description="What the hits are ordered by: with the second-stage ranking on (`recall_rerank`, the default) the "
        "model's probability that the memory answers the query, else the fused score."
    )
    session_id: str
    seq: int
    created_at: datetime
    kind: str = Field(
        "turn",
        description="turn (said in a session), memory (added directly) or summary (a block of a session's compacted "
        "turns, their first sentences).",
    )
    part: int | None = Field(None, description="A passage of a long turn: its place in the turn, from 1 (else null).")
    parts: int | None = Field(None, description="A passage of a long turn: how many passages the turn has (else null).")
    space: str | None = Field(None, description="The space it was recalled from; null: the user's own memory.")
    agent_id: str | None = Field(None, description="The agent that wrote it, where the request named one.")


class ContextResponse(BaseModel):
    messages: list[dict[str, Any]]
    usage: ContextUsage
    recalled: list[SearchHit]
    facts: list[FactOut]
    summary_included: bool
    included_seqs: list[int]
    degraded: list[str]
    standing: list[FactOut] = Field(
        default_factory=list,
        description="The user's standing instructions and preferences the prompt holds in their own section: those "
        "that bear on the query, newest first (facts holds the other categories).",
    )


class CompressResponse(BaseModel):
    session_id: str
    compacted: bool
    summary: str
    covers_upto_seq: int
    tokens_before: int
    tokens_after: int
    cas_conflicts: int = Field(description="Compare-and-set retries lost to a concurrent compaction.")
    degraded: bool = Field(False, description="The LLM failed and the extractive summary was used; redone later.")


class UserSessions(BaseModel):
    user_id: str
    sessions: list[dict[str, Any]]


class FactIn(Strict):
    value: StorableText = Field(min_length=1, max_length=4096, description="The fact's new value.")
    agent_id: AgentId | None = _agent()
    category: FactCategory = Field("fact", description="preference, fact, decision, task or instruction (holds from then on).")
    source_session: str | None = Field(None, pattern=ID_PATTERN, description="Session the fact was learnt in.")
    source_seqs: list[Seq] = Field(default_factory=list, max_length=256, description="Seqs of the turns that state it.")


class FactWrite(BaseModel):
    fact: FactOut
    changed: bool


class MemoryIn(Strict):
    text: StorableText = Field(min_length=1, max_length=8192, description="What to remember, in a sentence or a few.")
    id: str | None = Field(None, pattern=ID_PATTERN, description="Id to store it under; default: one made from the text.")
    created_at: Instant | None = Field(None, description="Naive = UTC; defaults to now.")
    agent_id: AgentId | None = _agent()


class MemoryOut(BaseModel):
    id: str
    text: str
    session_id: str
    seq: int
    role: str
    kind: str
    created_at: datetime
    agent_id: str | None = Field(None, description="The agent that wrote it.")
    added_by: str | None = Field(None, description="The key that added or promoted it, as the audit log names keys.")
    origin_user: str | None = Field(None, description="A memory promoted into a space: the user it came from.")
    origin_memory: str | None = Field(None, description="A memory promoted into a space: the memory it was copied from.")


class SearchRequest(Strict):
    query: StorableText = Field(min_length=1, max_length=8192, description="What to look for, in words.")
    spaces: list[SpaceName] = _spaces("Memory spaces searched beside the user's own memories (read grant needed).")
    top_k: int = Field(10, ge=1, le=100, description="The most memories returned.")
    min_score: float | None = Field(
        None, ge=-1, le=1, description="Dense similarity floor; default the service's recall_min_score, -1 = no floor."
    )
    explain: bool = Field(
        False,
        description="Answer with a SearchExplained: each candidate's dense, keyword and fused scores, and the ones the "
        "floors or top_k dropped, with the reason.",
    )


class ExplainedHit(SearchHit):
    """A candidate of either search, with what fusion and the second stage made of it."""

    role: str = Field(description="Who said it: user or assistant for a turn, memory for one added directly.")
    fused_score: float = Field(description="Its weighted reciprocal-rank fusion score (the first stage).")
    kept: bool
    reason: Literal[
        "similarity", "keywords", "no_floor", "similarity_floor", "keyword_coverage_floor", "keyword_share_floor", "beyond_limit"
    ] = Field(
        description="Kept: the floor it passed (similarity: on meaning, keywords: on words, no_floor). Dropped: the floor "
        "that stopped it, or beyond_limit (it passed but ranked below top_k)."
    )
    dense_similarity: float | None = Field(description="Cosine similarity to the query; null: not among the dense candidates.")
    dense_rank: int | None = Field(description="0-based rank among the dense candidates.")
    keyword_score: float | None = Field(description="BM25 score; null: not among the keyword candidates.")
    keyword_rank: int | None
    keyword_coverage: float | None = Field(description="Share of the query's idf weight the memory matches.")
    in_timeframe: bool = Field(description="From the time the query names (boosted).")


class Floors(BaseModel):
    min_similarity: float
    min_keyword_share: float
    min_keyword_coverage: float
    related_similarity: float = Field(
        description="A query whose nearest memory has this cosine or more is exempt from the coverage floor."
    )


class SearchExplained(BaseModel):
    hits: list[SearchHit] = Field(description="What the same search without explain answers.")
    candidates: list[ExplainedHit] = Field(
        description="Every candidate, kept or not: those that passed the floors in the hits' order (past top_k: "
        "beyond_limit), then those the floors stopped, best fused score first."
    )
    floors: Floors
    degraded: list[str]


class UserSummary(BaseModel):
    user_id: str
    memories: int = Field(description="Long-term memories stored.")
    facts: int = Field(description="Current facts.")


class UsersPage(BaseModel):
    users: list[UserSummary]
    next_after: str | None = Field(description="Pass as `after` for the next page; null at the end.")


class AuditEntry(BaseModel):
    id: int
    at: datetime
    actor: str = Field(description="The API key's SHA-256 prefix (`key:<12 hex>`), or `local` with keys off.")
    via: Literal["api", "inspector", "mcp"] = Field(
        description="A key on an API call, the inspector's signed-in session, or an MCP tool call."
    )
    action: Literal[
        "delete_memory",
        "close_fact",
        "delete_session",
        "forget_user",
        "import_user",
        "create_space",
        "delete_space",
        "grant_space",
        "revoke_space",
        "promote_memory",
        "promote_fact",
    ]
    target: dict[str, str]
    result: dict[str, int]


class ImportReport(BaseModel):
    """What an import wrote; nothing new when the archive was imported before."""

    user_id: str
    sessions: list[str] = Field(
        default_factory=list,
        description="The archive's sessions the user now holds; the memorizer makes their turns' memories, as for any "
        "session (searchable within a sweep or two).",
    )
    renamed: dict[str, str] = Field(
        default_factory=dict,
        description="Sessions stored under another id, because another user of the tenant holds theirs: archive id -> id.",
    )
    messages_added: int = 0
    memories_written: int = Field(
        0, description="Memories written now (summary blocks, and memories whose log expired); the others follow from the log."
    )
    facts_added: int = Field(0, description="Rows of fact history added.")


class AuditPage(BaseModel):
    entries: list[AuditEntry]
    next_before: int | None = Field(description="Pass as `before` for older entries; null at the end.")


class MemorizationStats(BaseModel):
    sessions_pending: int = Field(description="The tenant's sessions with turns not yet embedded.")
    oldest_pending_s: float | None = Field(description="Age of the oldest turn still waiting to be embedded.")
    llm_sessions_due: int = Field(description="Sessions that owe the LLM work (extraction, a summary, a degraded redo).")


class LLMStats(BaseModel):
    mode: str
    summary_fallbacks: int = Field(description="LLM summaries that fell back to extractive (redone later), since counting began.")
    extraction_failures: int


class RecallStats(BaseModel):
    samples: int = Field(
        description="The tenant's recalls (context and search) this ingress replica timed, the newest up to 1,000."
    )
    p50_ms: float | None
    p95_ms: float | None


class Stats(BaseModel):
    """Live figures of the tenant. Recall timings are those of the replica that answered; the rest is
    shared state in Redis and PostgreSQL."""

    memories: int
    memorization: MemorizationStats
    llm: LLMStats
    recall: RecallStats


class SessionExport(BaseModel):
    session: SessionInfo
    summary: str
    messages: list[StoredMessage]
    memories: list[MemoryOut]


class Deleted(BaseModel):
    deleted: bool
    details: dict[str, int] = Field(default_factory=dict)


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    backends: dict[str, str]


PRINCIPAL_PATTERN = r"^(key:[0-9a-f]{12}|local)$"


class SpaceIn(Strict):
    space_id: str = Field(pattern=SPACE_PATTERN, description="The space's name, unique in the tenant.")
    quota_memories: int | None = Field(
        None,
        ge=0,
        le=2**31 - 1,
        description="The most memories it holds (default space_quota_memories; 0 = the tenant's quota only).",
    )


class SpaceOut(BaseModel):
    space_id: str
    quota_memories: int
    created_by: str
    created_at: datetime
    role: SpaceRole | None = Field(description="The caller's grant on it (a tenant admin administers every space).")
    memories: int = Field(0, description="Memories it holds.")


class GrantIn(Strict):
    role: SpaceRole = Field(
        description="read: search and context; write: add and promote into it too; admin: grants and delete too."
    )


class GrantOut(BaseModel):
    principal: str = Field(description="The key, as the audit log names it: `key:<first 12 hex of its SHA-256>`, or `local`.")
    role: SpaceRole
    granted_by: str
    granted_at: datetime


class PromoteIn(Strict):
    space: SpaceName
    agent_id: AgentId | None = _agent()
