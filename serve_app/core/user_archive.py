"""The portable archive of one user's memory: its lines and how they are read back. Pure: no I/O.

JSON Lines, one object a line, each with a `type`: first the `archive` header (format, version,
the embedding model the user's vectors were made with), then each session (its checkpoint) followed
by its messages in seq order, then every memory, every row of every fact (history included), and
last an `end` line with the counts, so a cut-off archive is refused rather than half-read. A memory
line may carry its vector: an import under the same embedding takes it as it is (an int8 vector
depends a little on the batch it was embedded in, so embedding again would move near ties), one
under another model embeds again.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from serve_app.core.ids import ID_PATTERN

ARCHIVE_FORMAT = "agent-memory-serve/user-archive"
ARCHIVE_VERSION = 1
MEDIA_TYPE = "application/x-ndjson"

ArchiveId = Annotated[str, Field(pattern=ID_PATTERN)]


class _Line(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Embedding(_Line):
    model: str = Field(description="The sentence model the exporting service embeds with.")
    document_embedding: int = Field(description="Its scheme of document vectors (encoding.DOCUMENT_EMBEDDING).")
    int8: bool


class Header(_Line):
    type: Literal["archive"] = "archive"
    format: Literal["agent-memory-serve/user-archive"] = ARCHIVE_FORMAT
    version: int = Field(ARCHIVE_VERSION, ge=1)
    user_id: ArchiveId
    exported_at: datetime
    embedding: Embedding
    vectors: bool = Field(False, description="Whether memory lines carry their vectors.")
    space: bool = Field(False, description="The archive of a memory space, whose name user_id holds.")


class SessionLine(_Line):
    type: Literal["session"] = "session"
    session_id: ArchiveId
    messages: int = Field(ge=0, description="How many message lines follow, seqs 1..messages.")
    summary: str = ""
    covers_upto_seq: int = Field(0, ge=0)
    summary_degraded: bool = False
    summary_state: dict[str, Any] | None = None


class MessageLine(_Line):
    type: Literal["message"] = "message"
    session_id: ArchiveId
    seq: int = Field(ge=1)
    message: dict[str, Any] = Field(description="The message as the session log keeps it.")


class MemoryLine(_Line):
    type: Literal["memory"] = "memory"
    id: str = Field(min_length=1, max_length=256)
    kind: str = Field(min_length=1, max_length=16)
    role: str = Field(min_length=1, max_length=16)
    text: str = Field(min_length=1)
    session_id: str = Field("", max_length=128)
    seq: int = Field(0, ge=0)
    created_at: datetime | None = None
    vector: list[float] | None = Field(None, max_length=4096, description="Its stored vector, when the export asked for them.")
    agent_id: str | None = Field(None, max_length=128)
    added_by: str | None = Field(None, max_length=128)
    origin_user: str | None = Field(None, max_length=128)
    origin_memory: str | None = Field(None, max_length=256)


class FactLine(_Line):
    type: Literal["fact"] = "fact"
    key: str = Field(min_length=1, max_length=256)
    value: str
    category: str
    source_session: str | None = None
    source_seqs: list[int] = Field(default_factory=list)
    valid_from: datetime
    valid_to: datetime | None = None
    agent_id: str | None = Field(None, max_length=128)
    added_by: str | None = Field(None, max_length=128)
    origin_user: str | None = Field(None, max_length=128)
    said_at: datetime | None = None


class End(_Line):
    type: Literal["end"] = "end"
    counts: dict[str, int]


Line = Annotated[Header | SessionLine | MessageLine | MemoryLine | FactLine | End, Field(discriminator="type")]
_LINE = TypeAdapter(Line)


class ArchiveError(ValueError):
    """An archive that cannot be read: what is wrong, and on which line."""


class Archive(BaseModel):
    """An archive read whole and checked: every session with its messages in seq order."""

    header: Header
    sessions: list[SessionLine]
    messages: dict[str, list[MessageLine]]
    memories: list[MemoryLine]
    facts: list[FactLine]

    def counts(self) -> dict[str, int]:
        return {
            "sessions": len(self.sessions),
            "messages": sum(len(m) for m in self.messages.values()),
            "memories": len(self.memories),
            "facts": len(self.facts),
        }


def dump_line(line: _Line) -> str:
    return line.model_dump_json(exclude_none=True) + "\n"


def read_archive(lines: Iterable[str | bytes]) -> Archive:
    """The archive these lines hold, or ArchiveError naming the first line that is wrong: a header
    first, messages under their session in seq order, and an end line whose counts match."""
    header: Header | None = None
    sessions: list[SessionLine] = []
    messages: dict[str, list[MessageLine]] = {}
    memories: list[MemoryLine] = []
    facts: list[FactLine] = []
    end: End | None = None
    number = 0
    for number, raw in enumerate(lines, 1):
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        if not text.strip():
            continue
        if end is not None:
            raise ArchiveError(f"line {number}: nothing may follow the end line")
        try:
            line = _LINE.validate_python(json.loads(text))
        except (ValueError, ValidationError) as exc:
            raise ArchiveError(f"line {number}: {_reason(exc)}") from None
        if header is None:
            if not isinstance(line, Header):
                raise ArchiveError(f"line {number}: an archive starts with its 'archive' line")
            if line.version > ARCHIVE_VERSION:
                newer = f"archive version {line.version} is newer than this service reads ({ARCHIVE_VERSION})"
                raise ArchiveError(f"line {number}: {newer}")
            header = line
        elif isinstance(line, Header):
            raise ArchiveError(f"line {number}: a second 'archive' line")
        elif isinstance(line, SessionLine):
            if line.session_id in messages:
                raise ArchiveError(f"line {number}: session {line.session_id} appears twice")
            sessions.append(line)
            messages[line.session_id] = []
        elif isinstance(line, MessageLine):
            held = messages.get(line.session_id)
            if held is None or sessions[-1].session_id != line.session_id:
                raise ArchiveError(f"line {number}: a message of session {line.session_id} outside its session's lines")
            if line.seq != len(held) + 1:
                raise ArchiveError(f"line {number}: seq {line.seq} where {len(held) + 1} comes next")
            held.append(line)
        elif isinstance(line, MemoryLine):
            memories.append(line)
        elif isinstance(line, FactLine):
            facts.append(line)
        else:
            end = line
    if header is None:
        raise ArchiveError("the archive is empty")
    if end is None:
        raise ArchiveError(f"line {number}: the archive ends without its 'end' line (cut off?)")
    for session in sessions:
        held = len(messages[session.session_id])
        if held != session.messages:
            raise ArchiveError(f"session {session.session_id}: {held} messages, its line says {session.messages}")
    archive = Archive(header=header, sessions=sessions, messages=messages, memories=memories, facts=facts)
    if archive.counts() != end.counts:
        raise ArchiveError(f"the end line counts {end.counts}, the archive holds {archive.counts()}")
    return archive


def _reason(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"{where}: {first['msg']}" if where else first["msg"]
    return f"not JSON ({exc})"
