"""Which turns of an OpenAI chat request are new to the session log. Pure: no I/O.

OpenAI clients resend the whole conversation on every call, without ids. Each turn is reduced to a
fingerprint (role, whitespace-normalized text, name, tool call ids, names and arguments), the
request is aligned with the stored log, and only what the log does not hold yet is appended:

- CONTINUES: the log ends with the start of the request (the whole history resent, or its oldest
  turns dropped by the client): the rest of the request is new.
- REPLAYED: the whole request is already in the log (a retry, or the same request twice): nothing
  is new.
- DIVERGED: the request and the log part ways (an edited or regenerated turn, turns added over REST
  that the client never saw), or the log expired while the client kept its copy: old history is
  never appended again, only the request's newest turns (after its last assistant turn).
- NEW: an empty log and no earlier trace of the session: every turn is new.

New turns get ids from the session, their place in the log and their fingerprint, so two copies of
the same request racing each other append them once (the session log's append is idempotent by id).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Alignment(Enum):
    NEW = "new"
    CONTINUES = "continues"
    REPLAYED = "replayed"
    DIVERGED = "diverged"
    EXPIRED = "expired"


def _arguments(value: Any) -> str:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return " ".join(value.split())
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def fingerprint(message: Mapping[str, Any]) -> str:
    """What identifies a turn whoever sends it again: role, text, name, tool call ids and calls."""
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        calls.append([call.get("id") or "", function.get("name", ""), _arguments(function.get("arguments", ""))])
    parts = [
        message.get("role", ""),
        " ".join(str(message.get("content") or "").split()),
        message.get("name") or "",
        message.get("tool_call_id") or "",
        json.dumps(calls, ensure_ascii=False),
    ]
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True)
class Plan:
    alignment: Alignment
    new: list[dict[str, Any]]
    """The request's turns to append, in order."""
    ids: list[str]
    """A deterministic id for each of them."""


def _newest(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's newest exchange, never older history: the turns after its last assistant turn,
    or from that turn on when it called tools (its results are among them: a call and its results
    are stored together)."""
    last_assistant = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    if last_assistant >= 0 and messages[last_assistant].get("tool_calls"):
        return list(messages[last_assistant:])
    return list(messages[last_assistant + 1 :] or messages[-1:])


def plan_append(
    stored: Sequence[str], messages: Sequence[dict[str, Any]], *, session: str, log_length: int, seen_before: bool
) -> Plan:
    """What of `messages` (the request's non-system turns) the log lacks. `stored`: fingerprints of
    the log's last turns (all of them, or a tail longer than the request); `log_length`: the whole
    log's; `seen_before`: the session left memories, so an empty log means it expired."""
    request = [fingerprint(m) for m in messages]
    alignment, new = Alignment.NEW, list(messages)
    if not stored:
        if seen_before and len(messages) > 1:
            alignment, new = Alignment.EXPIRED, _newest(messages)
    else:
        best_continue, best_replay = 0, False
        for start in (i for i, fp in enumerate(stored) if request and fp == request[0]):
            length = 0
            while length < len(request) and start + length < len(stored) and stored[start + length] == request[length]:
                length += 1
            if start + length == len(stored):
                best_continue = max(best_continue, length)
            if length == len(request):
                best_replay = True
        if best_continue:
            alignment, new = Alignment.CONTINUES, list(messages[best_continue:])
        elif best_replay:
            alignment, new = Alignment.REPLAYED, []
        else:
            alignment, new = Alignment.DIVERGED, _newest(messages)
    ids = [turn_id(session, log_length + i, fingerprint(m)) for i, m in enumerate(new)]
    return Plan(alignment, new, ids)


def turn_id(session: str, position: int, print_: str) -> str:
    """The client id of a turn appended at `position` (0-based) of the session's log."""
    return "oa-" + hashlib.sha256(f"{session}\x1f{position}\x1f{print_}".encode()).hexdigest()[:32]


def derived_session_id(tenant: str, user: str, system_prompt: str, first: Mapping[str, Any] | None) -> str:
    """A session id that comes out the same on every call of a conversation whose client sends none:
    from who speaks, the system prompt and the conversation's first turn."""
    seed = "\x1f".join([tenant, user, " ".join(system_prompt.split()), fingerprint(first or {})])
    return "chat-" + hashlib.sha256(seed.encode("utf-8")).hexdigest()[:24]
