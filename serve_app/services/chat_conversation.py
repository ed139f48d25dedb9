"""A chat request as memory sees it: who speaks, in which session, with which system prompt and turns."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from serve_app.chat_schemas import ChatCompletionRequest
from serve_app.core.ids import validate_id
from serve_app.core.spaces import MAX_SPACES_PER_REQUEST, SPACE_PATTERN
from serve_app.errors import InvalidRequest
from serve_app.services.dependencies import Dependencies


@dataclass
class Conversation:
    """A chat request as memory sees it."""

    user: str
    session: str | None
    """The session the client named (X-Session-Id or metadata.session_id); None: memory finds it."""
    system_prompt: str | None
    turns: list[dict[str, Any]]
    """Non-system turns in order, content as text."""
    spaces: list[str] = field(default_factory=list)
    """Memory spaces recalled too (X-Memory-Spaces or metadata.memory_spaces, comma-separated)."""
    write_space: str | None = None
    """The space the call's turns are memorized into (X-Memory-Space or metadata.memory_space)."""


def _text(content: str | list[dict[str, Any]] | None) -> str:
    """Text parts joined; any other part (an image, audio) is refused for now."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        if part.get("type") != "text":
            raise InvalidRequest(f"content parts of type {part.get('type')!r} are not supported: only text", param="messages")
        texts.append(str(part.get("text", "")))
    return "\n".join(texts)


def _user(deps: Dependencies, request: ChatCompletionRequest, headers: dict[str, str]) -> str:
    header = headers.get("x-user-id")
    if header and deps.settings.chat_user_header_wins:
        return header
    return request.user or request.safety_identifier or header or deps.settings.chat_default_user


_SPACE = re.compile(SPACE_PATTERN)


def _spaces(headers: dict[str, str], metadata: dict[str, Any]) -> tuple[list[str], str | None]:
    """(spaces to read, space to write), each named as the REST API names spaces."""
    named = headers.get("x-memory-spaces") or metadata.get("memory_spaces") or ""
    read = list(dict.fromkeys(s.strip() for s in str(named).split(",") if s.strip()))
    write = (headers.get("x-memory-space") or metadata.get("memory_space") or "").strip() or None
    if len(read) > MAX_SPACES_PER_REQUEST:
        raise InvalidRequest(f"at most {MAX_SPACES_PER_REQUEST} memory spaces a call", param="metadata.memory_spaces")
    for space, param in [*((s, "metadata.memory_spaces") for s in read), *([(write, "metadata.memory_space")] if write else [])]:
        if not _SPACE.fullmatch(space):
            raise InvalidRequest(f"memory space {space[:64]!r} is not a space id ({SPACE_PATTERN})", param=param)
    return read, write


def conversation(deps: Dependencies, request: ChatCompletionRequest, headers: dict[str, str]) -> Conversation:
    """Who speaks, in which session, with which system prompt and turns."""
    system, turns = [], []
    for message in request.messages:
        text = _text(message.content)
        if message.role in ("system", "developer"):
            system.append(text)
            continue
        turn: dict[str, Any] = {"role": message.role, "content": text}
        if message.name:
            turn["name"] = message.name
        if message.tool_call_id:
            turn["tool_call_id"] = message.tool_call_id
        if message.tool_calls:
            turn["tool_calls"] = [call.model_dump(exclude_none=True) for call in message.tool_calls]
        turns.append(turn)
    if not turns:
        raise InvalidRequest("messages hold no user, assistant or tool turn", param="messages")
    user = _user(deps, request, headers)
    session = headers.get("x-session-id") or (request.metadata or {}).get("session_id")
    try:
        validate_id(user, "user")
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="user") from None
    if session:
        try:
            validate_id(session, "session id")
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="metadata.session_id") from None
    read, write = _spaces(headers, request.metadata or {})
    return Conversation(user, session, "\n\n".join(system) if system else None, turns, read, write)
