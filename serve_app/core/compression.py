"""Compression policy and the extractive summary (first rung of the ladder). Pure: no I/O.

A turn leaves the prompt only once a checkpoint covers it; the log itself is never edited.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

# Longest-first alternation so that "ORD-2024-0042" is one item, not three numbers.
_MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
KEY_ITEM_PATTERN = re.compile(
    r"|".join(
        [
            r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+",  # e-mail
            r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?)?\b",  # ISO date/time
            r"\b\d{1,2}/\d{1,2}/\d{2,4}\b",  # 5/8/2023
            rf"\b{_MONTH}\.? \d{{1,2}}(?:st|nd|rd|th)?(?:,? \d{{4}})?\b",  # May 8, 2023
            rf"\b\d{{1,2}}(?:st|nd|rd|th)? {_MONTH}\.?(?:,? \d{{4}})?\b",  # 8 May 2023
            r"\b\d{1,2}:\d{2}(?:\s?[ap]\.?m\.?)?",  # 10:30 pm
            r"[$€£¥]\s?\d[\d,]*(?:\.\d+)?(?:\s?[kKmM]\b)?",  # $1,234.50
            # ids: letters and digits mixed, optionally joined by - or _ (ORD-12345, A1B2, tx_9f3a)
            r"\b(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[A-Za-z0-9]+(?:[-_][A-Za-z0-9]+)*\b",
            r"\b\d[\d,]*(?:\.\d+)?%?",  # plain numbers, amounts, percentages
        ]
    ),
    re.IGNORECASE,
)


def extract_key_items(text: str) -> list[str]:
    """Numbers, ids, dates, times, amounts and e-mails in order of first appearance, deduplicated."""
    seen: dict[str, None] = {}
    for match in KEY_ITEM_PATTERN.finditer(text):
        item = match.group(0).strip().rstrip(".,")
        if item and item not in seen:
            seen[item] = None
    return list(seen)


def message_text(message: dict[str, Any]) -> str:
    """Everything a message says, tool-call names and arguments included."""
    parts = [str(message.get("content") or "")]
    for call in message.get("tool_calls") or []:
        function = call.get("function", call)
        parts.append(f"{function.get('name', '')}({function.get('arguments', '')})")
    return " ".join(p for p in parts if p)


def split_rounds(messages: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Rounds start at each user message; tool calls and results stay in their round."""
    rounds: list[list[dict[str, Any]]] = []
    for message in messages:
        if message.get("role") == "user" or not rounds:
            rounds.append([])
        rounds[-1].append(message)
    return rounds


def plan_compaction(
    turns: Sequence[dict[str, Any]],
    unsummarized_tokens: int,
    *,
    trigger_tokens: int,
    keep_rounds: int,
    force: bool = False,
) -> int | None:
    """The seq the next checkpoint should cover, or None when nothing should be compacted.

    `turns` are the messages after the current checkpoint, each with its `seq`, in order.
    Everything but the newest `keep_rounds` rounds is compacted, so a tool call never leaves
    without its result and at least `keep_rounds` raw rounds stay in the prompt.
    """
    if not force and unsummarized_tokens <= trigger_tokens:
        return None
    rounds = split_rounds(turns)
    if len(rounds) <= keep_rounds:
        return None
    span = rounds[: len(rounds) - keep_rounds]
    return int(span[-1][-1]["seq"])


@dataclass
class SummaryState:
    """What the extractive summary keeps: one gist line per compacted turn and every key item."""

    covers_from_seq: int = 1
    lines: list[str] = field(default_factory=list)
    key_items: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"covers_from_seq": self.covers_from_seq, "lines": self.lines, "key_items": self.key_items}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SummaryState:
        if not data:
            return cls()
        return cls(
            covers_from_seq=int(data.get("covers_from_seq", 1)),
            lines=list(data.get("lines", [])),
            key_items=list(data.get("key_items", [])),
        )


GIST_WORDS = 24


def gist(message: dict[str, Any]) -> str:
    """First sentence of a turn, at most GIST_WORDS words."""
    text = " ".join(message_text(message).split())
    sentence = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0]
    words = sentence.split(" ")
    if len(words) > GIST_WORDS:
        sentence = " ".join(words[:GIST_WORDS]) + " …"
    return sentence


def gist_line(message: dict[str, Any]) -> str:
    """A turn's gist, tagged with its seq and role."""
    return f"[#{message['seq']} {message.get('role')}] {gist(message)}"


def render_summary(state: SummaryState, covers_upto_seq: int) -> str:
    head = f"Earlier conversation, turns {state.covers_from_seq}-{covers_upto_seq} (extractive summary):"
    body = "\n".join(f"- {line}" for line in state.lines)
    items = "Key details: " + "; ".join(state.key_items) if state.key_items else ""
    return "\n".join(part for part in (head, body, items) if part)


def extractive_summary(
    previous: SummaryState,
    span: Sequence[dict[str, Any]],
    covers_upto_seq: int,
    *,
    max_tokens: int,
    count_tokens: Callable[[str], int],
) -> tuple[SummaryState, str]:
    """Fold `span` into the previous summary without a model.

    Every key item of the span survives; gist lines are dropped oldest first when the text
    passes `max_tokens` (key items are never dropped, so they may push it over).
    """
    key_items = dict.fromkeys(previous.key_items)
    lines = list(previous.lines)
    for message in span:
        if message.get("role") == "system":
            continue
        lines.append(gist_line(message))
        key_items.update(dict.fromkeys(extract_key_items(message_text(message))))
    state = SummaryState(previous.covers_from_seq, lines, list(key_items))
    text = render_summary(state, covers_upto_seq)
    while state.lines and count_tokens(text) > max_tokens:
        drop = max(1, len(state.lines) // 8)
        state.lines = state.lines[drop:]
        text = render_summary(state, covers_upto_seq)
    return state, text
