"""Which turns of an OpenAI chat request are new to the session log. Pure: no I/O.

OpenAI clients send either the whole conversation on every call or only its newest turns, without
ids. What is new is decided by position, never by searching the log for matching words: the same
words said again are a new turn. Each turn is reduced to a fingerprint (role, whitespace-normalized
text, name, tool call ids, names and arguments), and the request is laid against the log's tail:

- CONTINUES: the log ends with the start of the request (the whole history resent, or its oldest
  turns dropped by the client): the rest of the request is new, at least its newest turn.
- LATEST: the request holds no history (no answer before its newest exchange): every turn of it
  is new (a client that sends only the newest turn with a session id).
- DIVERGED: the request's history is not the log's tail (an edited or regenerated turn, turns added
  over REST that the client never saw): old history is never appended again, only the request's
  newest exchange (after its last answer: a question with its tool calls and their results).
- EXPIRED: an empty log for a session that left memories (its log expired while the client kept
  its copy): only the newest exchange.
- NEW: an empty log and no earlier trace of the session: every turn is new.

Whether a request is a retry of an earlier one is not decided here: the client says so
(`services/chat_calls.py`). A new call's turns get ids from the call, so two calls at once that
carry the same words store both, and a retry of one call stores nothing twice.
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
    LATEST = "latest"
    DIVERGED = "diverged"
    EXPIRED = "expired"
    RETRIED = "retried"
    """A retry of a call the service already took (marked by the client): its turns as that call stored them."""


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
        function = call.get("function") if isinstance(call, Mapping) else None
        function = function if isinstance(function, Mapping) else {}
        ident = call.get("id") if isinstance(call, Mapping) else None
        calls.append([str(ident or ""), str(function.get("name", "")), _arguments(function.get("arguments", ""))])
    parts = [
        str(message.get("role", "")),
        " ".join(str(message.get("content") or "").split()),
        str(message.get("name") or ""),
        str(message.get("tool_call_id") or ""),
        json.dumps(calls, ensure_ascii=False),
    ]
    return hashlib.sha256("\x1f".join(parts).encode("utf-8", "backslashreplace")).hexdigest()[:32]


@dataclass(frozen=True)
class Plan:
    alignment: Alignment
    new: list[dict[str, Any]]
    """The request's turns to append, in order: always a tail of the request."""


def last_assistant(messages: Sequence[Mapping[str, Any]]) -> int:
    """Index of the request's last assistant turn, -1 when it has none."""
    return max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)


def newest(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's newest exchange, never older history: the turns after its last answer (an
    assistant turn that calls no tool), so a question, the tool calls made for it and their results
    are stored together."""
    answered = max((i for i, m in enumerate(messages) if m.get("role") == "assistant" and not m.get("tool_calls")), default=-1)
    return list(messages[answered + 1 :] or messages[-1:])


def overlap(stored: Sequence[str], request: Sequence[str]) -> int:
    """The most turns k < len(request) with which the log ends as the request begins (the log's
    last k fingerprints are the request's first k): the request's history, laid on the log's tail."""
    for k in range(min(len(request) - 1, len(stored)), 0, -1):
        if list(stored[len(stored) - k :]) == list(request[:k]):
            return k
    return 0


def plan_append(stored: Sequence[str], messages: Sequence[dict[str, Any]], *, seen_before: bool) -> Plan:
    """What of `messages` (the request's non-system turns) the log lacks. `stored`: fingerprints of
    the log's last turns (a tail at least as long as the request); `seen_before`: the session left
    memories, so an empty log means it expired."""
    if not stored:
        if seen_before and len(messages) > 1:
            return Plan(Alignment.EXPIRED, newest(messages))
        return Plan(Alignment.NEW, list(messages))
    k = overlap(stored, [fingerprint(m) for m in messages])
    if k:
        return Plan(Alignment.CONTINUES, list(messages[k:]))
    if newest(messages) == list(messages):
        return Plan(Alignment.LATEST, list(messages))
    return Plan(Alignment.DIVERGED, newest(messages))


def turn_id(call: str, position: int | str) -> str:
    """The client id of the turn at `position` of one call's new turns ("answer": its answer): the
    same on every retry of the call, another for every other call."""
    return "oa-" + hashlib.sha256(f"{call}\x1f{position}".encode()).hexdigest()[:32]


def history_digest(tenant: str, user: str, system_prompt: str, turns: Sequence[Mapping[str, Any]]) -> str:
    """What names a conversation whose client sends no session id: who speaks, the system prompt and
    every turn up to the last answer it holds. The service keeps it for each answer it stores, so
    the next call, which resends that history, finds the session again."""
    prints = "\x1e".join(fingerprint(t) for t in turns)
    seed = "\x1f".join([tenant, user, " ".join(system_prompt.split()), prints])
    return hashlib.sha256(seed.encode("utf-8", "backslashreplace")).hexdigest()[:40]
