"""What the inspector's pages compute from API answers: pure, so it is unit-tested alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The budget bar, in the order the prompt holds them.
SECTION_ORDER = ("system", "memory", "summary", "history", "tool_results", "template", "tool_definitions", "output_reserved")
SECTION_LABELS = {
    "system": "System",
    "memory": "Memory",
    "summary": "Summary",
    "history": "History",
    "tool_results": "Tool results",
    "template": "Chat template",
    "tool_definitions": "Tool definitions",
    "output_reserved": "Reserved output",
}


@dataclass(frozen=True)
class Action:
    title: str
    fields: tuple[str, ...]
    path: str
    """The API route it calls (DELETE), its fields in braces."""
    warning: str


ACTIONS: dict[str, Action] = {
    "delete_memory": Action(
        "Delete a memory",
        ("user_id", "memory_id"),
        "/v1/users/{user_id}/memories/{memory_id}",
        "The memory leaves both indexes; the session log it came from stays.",
    ),
    "close_fact": Action(
        "Close a fact",
        ("user_id", "key"),
        "/v1/users/{user_id}/facts/{key}",
        "The fact stops being current; its history stays.",
    ),
    "delete_session": Action(
        "Delete a session",
        ("session_id",),
        "/v1/sessions/{session_id}",
        "The log, its summary and the memories made from it are deleted.",
    ),
    "forget_user": Action(
        "Forget a user",
        ("user_id",),
        "/v1/users/{user_id}",
        "Every session, memory and fact of the user is deleted, in every store.",
    ),
}


@dataclass(frozen=True)
class BarPart:
    section: str
    label: str
    tokens: int
    percent: float


def budget_bar(usage: dict[str, Any]) -> list[BarPart]:
    """Each section's share of max_tokens (reserved output included), then what is left free."""
    total = max(1, int(usage["max_tokens"]))
    sections = usage["sections"]
    parts = [
        BarPart(
            name, SECTION_LABELS.get(name, name), int(sections[name]["tokens"]), round(100 * sections[name]["tokens"] / total, 2)
        )
        for name in (*SECTION_ORDER, *(n for n in sections if n not in SECTION_ORDER))
        if name in sections and sections[name]["tokens"] > 0
    ]
    used = sum(p.tokens for p in parts)
    if used < total:
        parts.append(BarPart("free", "Free", total - used, round(100 * (total - used) / total, 2)))
    return parts


def omitted_seqs(unsummarized: list[dict[str, Any]], included: list[int]) -> list[int]:
    """Turns after the checkpoint that the prompt left out for room."""
    kept = set(included)
    return [m["seq"] for m in unsummarized if m["seq"] not in kept]


@dataclass(frozen=True)
class LogRow:
    message: dict[str, Any] | None
    """None: the row is the summary checkpoint's boundary."""
    memorized: bool = False
    extracted: bool = False


def log_rows(messages: list[dict[str, Any]], info: dict[str, Any]) -> list[LogRow]:
    """A page of the log with the checkpoint's boundary after the last turn it covers, each turn
    marked with the cursors it is behind."""
    covers = int(info["covers_upto_seq"])
    rows: list[LogRow] = []
    for message in messages:
        seq = int(message["seq"])
        rows.append(LogRow(message, seq <= info["memorized_upto_seq"], seq <= info["extracted_upto_seq"]))
        if seq == covers:
            rows.append(LogRow(None))
    if covers and messages and int(messages[0]["seq"]) == covers + 1:
        rows.insert(0, LogRow(None))  # the page starts after the boundary: show it on top
    return rows


def named_spaces(text: str) -> list[str]:
    """The spaces a comma-separated field names, each once, in order; the API checks each name and
    the key's grant on it, so a bad one comes back as the API's own error."""
    return list(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
