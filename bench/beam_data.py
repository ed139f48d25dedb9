"""Reading BEAM conversations (`chat.json` and `probing_questions/probing_questions.json` of one
folder): messages with their batch's date, and the questions that name the messages holding their
evidence. The format is in ../shared/data/beam/README.md."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ABSTENTION = "abstention"  # its questions name no source message: nothing to recall
ABILITIES = {
    "information_extraction": "information extraction",
    "temporal_reasoning": "temporal reasoning",
    "knowledge_update": "knowledge update (old and new value)",
    "contradiction_resolution": "contradiction (both statements)",
    "multi_session_reasoning": "multi-session reasoning",
    "preference_following": "preference following",
    "summarization": "summarization (many sessions)",
    "event_ordering": "event ordering",
    "instruction_following": "instruction following",
}
# The field that says what a good answer holds, first match wins: the following questions have no
# answer but the instruction or preference their source message states.
ANSWER_FIELDS = ("answer", "ideal_answer", "ideal_summary", "instruction_being_tested", "preference_being_tested")


def default_data_dir() -> Path:
    """`shared/data/beam` beside the repository: the data is never copied into it."""
    return Path(__file__).resolve().parents[2] / "shared" / "data" / "beam"


@dataclass(frozen=True)
class Message:
    id: int
    role: str
    content: str
    batch: int
    when: datetime


@dataclass(frozen=True)
class Question:
    ability: str
    text: str
    sources: tuple[int, ...]
    """The distinct ids of the messages that hold the evidence, in the order the file names them."""
    answer: str
    """What a good answer says (or the instruction it follows): picks a source message's answer passage."""


@dataclass(frozen=True)
class Conversation:
    name: str
    messages: list[Message]
    questions: list[Question]


def parse_anchor(text: str) -> datetime:
    """`March-15-2024` as midnight UTC."""
    return datetime.strptime(text.strip(), "%B-%d-%Y").replace(tzinfo=UTC)


def batch_date(batch: dict[str, Any]) -> datetime:
    """The batch's `time_anchor`, or that of its first message that has one."""
    anchor = batch.get("time_anchor") or next(
        (m["time_anchor"] for exchange in batch["turns"] for m in exchange if m.get("time_anchor")), None
    )
    if anchor is None:
        raise ValueError(f"batch {batch.get('batch_number')} has no time anchor")
    return parse_anchor(anchor)


def messages_of(chat: list[dict[str, Any]]) -> list[Message]:
    """Every message in conversation order, dated by its batch."""
    out = []
    for batch in chat:
        when = batch_date(batch)
        for exchange in batch["turns"]:
            out += [Message(m["id"], m["role"], m["content"], batch["batch_number"], when) for m in exchange]
    return out


def source_ids(value: Any) -> list[int]:
    """`source_chat_ids` flattened: a list, an object of lists, or lists of lists (event ordering
    groups its mentions); distinct ids, first mention first."""
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    items = value.values() if isinstance(value, dict) else value
    out: list[int] = []
    for item in items:
        out += [i for i in source_ids(item) if i not in out]
    return out


def reference_answer(question: dict[str, Any]) -> str:
    return next((str(question[f]) for f in ANSWER_FIELDS if question.get(f)), question["question"])


def questions_of(probing: dict[str, list[dict[str, Any]]]) -> list[Question]:
    """Every question that names at least one source message (abstention never does)."""
    out = []
    for ability, questions in probing.items():
        if ability == ABSTENTION:
            continue
        for question in questions:
            sources = source_ids(question.get("source_chat_ids"))
            if sources:
                out.append(Question(ability, question["question"], tuple(sources), reference_answer(question)))
    return out


def load_conversation(folder: Path) -> Conversation:
    chat = json.loads((folder / "chat.json").read_text())
    probing = json.loads((folder / "probing_questions" / "probing_questions.json").read_text())
    return Conversation(folder.name, messages_of(chat), questions_of(probing))


def conversation_folders(data: Path, names: list[str] | None = None) -> list[Path]:
    """The numbered folders of `data` in numeric order, or only those named."""
    folders = sorted((p for p in data.iterdir() if (p / "chat.json").is_file()), key=lambda p: (len(p.name), p.name))
    if names:
        wanted = set(names)
        missing = wanted - {p.name for p in folders}
        if missing:
            raise SystemExit(f"no conversation {sorted(missing)} in {data}")
        folders = [p for p in folders if p.name in wanted]
    return folders


def truncated(conversation: Conversation, limit: int | None) -> Conversation:
    """The first `limit` messages and the questions with a source among them (sources cut to those):
    a quick run, not a figure."""
    if limit is None:
        return conversation
    messages = conversation.messages[:limit]
    kept = {m.id for m in messages}
    questions = []
    for q in conversation.questions:
        sources = tuple(s for s in q.sources if s in kept)
        if sources:
            questions.append(Question(q.ability, q.text, sources, q.answer))
    return Conversation(conversation.name, messages, questions)
