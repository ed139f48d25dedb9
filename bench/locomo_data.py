"""Reading LoCoMo conversation files: sessions, turns as the benchmark stores them, questions."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}


def session_numbers(conversation: dict) -> list[int]:
    return sorted(int(m.group(1)) for key in conversation if (m := re.fullmatch(r"session_(\d+)", key)))


def parse_date(text: str) -> datetime:
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


def turn_content(turn: dict) -> str:
    content = f"{turn['speaker']}: {turn['text']}"
    if turn.get("blip_caption"):
        content += f" [shares a photo: {turn['blip_caption']}]"
    return content


@dataclass
class Turn:
    session: int
    seq: int
    dia_id: str
    role: str
    content: str
    when: datetime


@dataclass
class Question:
    text: str
    evidence: set[str]
    category: int


def turns_of(data: dict) -> list[Turn]:
    """Only the dialogue: never the files' summaries, observations or events."""
    conversation = data.get("conversation", data)
    out = []
    for number in session_numbers(conversation):
        when = parse_date(conversation[f"session_{number}_date_time"])
        for seq, turn in enumerate(conversation[f"session_{number}"], 1):
            role = "user" if turn["speaker"] == conversation["speaker_a"] else "assistant"
            out.append(Turn(number, seq, turn["dia_id"], role, turn_content(turn), when))
    return out


def questions_of(data: dict) -> list[Question]:
    """Categories 1-4 with their evidence ids split on ';' and trimmed."""
    out = []
    for qa in data["qa"]:
        if qa.get("category") not in CATEGORIES:
            continue
        evidence = {e.strip() for item in qa["evidence"] for e in str(item).split(";") if e.strip()}
        if evidence:
            out.append(Question(qa["question"], evidence, qa["category"]))
    return out


def recall_at(ranked_dia_ids: list[str], evidence: set[str], k: int) -> float:
    """Share of the evidence among the first k distinct dia_ids."""
    distinct: list[str] = []
    for dia in ranked_dia_ids:
        if dia not in distinct:
            distinct.append(dia)
    return len(evidence & set(distinct[:k])) / len(evidence)
