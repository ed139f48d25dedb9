"""Fit a prompt into a token budget with exact Qwen2.5 counts. Pure: no I/O.

Order of claims: system prompt and the newest turn (mandatory), the summary, tool results and
memory up to their shares, then history newest-first with everything left. A tool call is never
split from its results, turns are never cut, and the prompt never exceeds max_tokens - reserve.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from serve_app.core import tokenizer
from serve_app.core.tokenizer import count_block, count_tokens
from serve_app.errors import BudgetError

FACTS_HEADER = "\n\n# Known facts about the user"
MEMORIES_HEADER = "\n\n# Relevant memories from earlier conversations"
SUMMARY_HEADER = "\n\n# Summary of the earlier part of this conversation\n"
TOOLS_HEADER = "\n\n# Tool results\n"
MIN_TRUNCATED_TOOL_TOKENS = 16
# The tool definitions follow the system section, whose last characters can merge with their first
# newlines when tokenized: reserved with this margin, then counted exactly.
TOOL_DEFINITIONS_MARGIN = 4


class BudgetShares(BaseModel):
    """Share of `max_tokens` per prompt section; what a section leaves unused goes to history.
    The one definition: settings, requests and the builder all use it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    system: float = Field(0.06, ge=0, le=1)
    memory: float = Field(0.12, ge=0, le=1, description="Recalled memories and user facts.")
    history: float = Field(0.62, ge=0, le=1, description="Session summary and recent turns.")
    tools: float = Field(0.12, ge=0, le=1)
    output: float = Field(0.06, ge=0, le=1, description="Reserved for the model's answer.")

    @model_validator(mode="after")
    def _sum_at_most_one(self) -> BudgetShares:
        total = self.system + self.memory + self.history + self.tools + self.output
        if total > 1.0 + 1e-9:
            raise ValueError(f"budget shares add up to {total:.3f}, more than 1")
        return self


@dataclass
class ContextRequest:
    """Everything the builder needs, already fetched. `turns` are after the checkpoint, oldest first."""

    max_tokens: int
    shares: BudgetShares
    system_prompt: str | None = None
    reserve_output: int | None = None
    summary: str | None = None
    turns: Sequence[dict[str, Any]] = ()
    facts: Sequence[str] = ()
    memories: Sequence[str] = ()
    tool_results: Sequence[dict[str, Any]] = ()
    tools: Sequence[dict[str, Any]] = ()
    """Tool definitions of a chat request: the template renders them after the system prompt."""


@dataclass
class Section:
    tokens: int = 0
    budget: int = 0


@dataclass
class ContextResult:
    messages: list[dict[str, Any]]
    total_tokens: int
    limit: int
    reserve_output: int
    omitted_turns: int
    included_seqs: list[int]
    facts_used: int
    memories_used: int
    tool_results_used: int
    sections: dict[str, Section] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def group_blocks(turns: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Atomic units of history: a message plus any tool results that follow it."""
    blocks: list[list[dict[str, Any]]] = []
    for turn in turns:
        if turn.get("role") == "tool" and blocks:
            blocks[-1].append(turn)
        else:
            blocks.append([turn])
    return blocks


def _public(turn: dict[str, Any]) -> dict[str, Any]:
    keep = ("role", "content", "name", "tool_calls", "tool_call_id")
    return {k: turn[k] for k in keep if turn.get(k) not in (None, [])} | {"content": turn.get("content") or ""}


def _system_tokens(content: str) -> int:
    return count_tokens(f"<|im_start|>system\n{content}<|im_end|>\n")


def _last_line_start(text: str) -> int:
    """Where the last line that starts with a non-space character begins (0 if none).

    No piece of the tokenizer's pre-split (Qwen2's pattern) runs from a newline into a non-space
    character, and a newline composes with nothing under NFC, so the tokens before this point do not
    depend on anything appended after it."""
    end = len(text)
    while (newline := text.rfind("\n", 0, end)) >= 0:
        if newline + 1 < len(text) and not text[newline + 1].isspace():
            return newline + 1
        end = newline
    return 0


def _appended_tokens(content: str, extra: str) -> int:
    """Exactly `_system_tokens(content + extra) - _system_tokens(content)`, tokenizing only the
    last line of `content`: the system section grows a line at a time, and re-tokenizing all of it
    per line made building a 4k-token context cost a millisecond more."""
    prefix = "system\n" + content  # the text between <|im_start|> and <|im_end|>
    tail = prefix[_last_line_start(prefix) :]
    return count_tokens(tail + extra) - count_tokens(tail)


def _truncate_to_tokens(text: str, max_tokens: int) -> str:
    ids = tokenizer.encode(text)
    if len(ids) <= max_tokens:
        return text
    cut = tokenizer.qwen25_encoding().decode(ids[: max(0, max_tokens - 2)])
    return cut + " …"


def build_context(req: ContextRequest) -> ContextResult:
    max_tokens = req.max_tokens
    reserve = req.reserve_output if req.reserve_output is not None else int(max_tokens * req.shares.output)
    limit = max_tokens - reserve
    if limit <= 0:
        raise BudgetError(
            f"reserve_output ({reserve}) leaves no room in max_tokens ({max_tokens})",
            {"max_tokens": max_tokens, "reserve_output": reserve},
        )
    template = count_tokens(tokenizer.GENERATION_PROMPT)
    system_text = req.system_prompt if req.system_prompt is not None else tokenizer.DEFAULT_SYSTEM_PROMPT
    system_tokens = _system_tokens(system_text)

    tool_definitions = tokenizer.tools_text(req.tools)
    tools_reserved = _appended_tokens(system_text, tool_definitions) + TOOL_DEFINITIONS_MARGIN if tool_definitions else 0
    fixed = template + tools_reserved
    blocks = group_blocks(req.turns)
    block_tokens = [count_block(block) for block in blocks]
    newest = block_tokens[-1] if blocks else 0
    mandatory = system_tokens + fixed + newest
    if mandatory > limit:
        raise BudgetError(
            f"system prompt ({system_tokens} tokens), tool definitions ({tools_reserved}) and newest turn ({newest} tokens) need "
            f"{mandatory} tokens with the template; max_tokens - reserve_output is {limit}",
            {
                "system": system_tokens,
                "newest_turn": newest,
                "template": template,
                "tool_definitions": tools_reserved,
                "limit": limit,
            },
        )
    notes: list[str] = []
    content = system_text
    current = system_tokens

    def grown(extra: str) -> int:
        return _appended_tokens(content, extra)

    def room() -> int:
        return limit - current - fixed - newest

    # Summary: part of the history share, but it goes in before any older turn.
    summary_tokens = 0
    if req.summary:
        section = SUMMARY_HEADER + req.summary
        cost = grown(section)
        if cost > room():
            section = SUMMARY_HEADER + _truncate_to_tokens(req.summary, max(0, room() - 16))
            cost = grown(section)
            notes.append("summary_truncated")
        if cost <= room():
            content += section
            current += cost
            summary_tokens = cost

    # Tool results: up to their share; the one that overflows is cut, the rest dropped.
    tools_budget = int(max_tokens * req.shares.tools)
    tools_tokens = 0
    tools_used = 0
    for i, result in enumerate(req.tool_results):
        name = result.get("name") or "tool"
        piece = ("" if i else TOOLS_HEADER) + f'<tool_response name="{name}">\n{result.get("content", "")}\n</tool_response>\n'
        cost = grown(piece)
        allowed = min(tools_budget - tools_tokens, room())
        if cost > allowed:
            keep = allowed - (cost - count_tokens(str(result.get("content", ""))))
            if keep < MIN_TRUNCATED_TOOL_TOKENS:
                break
            short = _truncate_to_tokens(str(result.get("content", "")), keep - 2)
            piece = ("" if i else TOOLS_HEADER) + f'<tool_response name="{name}">\n{short}\n</tool_response>\n'
            cost = grown(piece)
            if cost > allowed:
                break
            notes.append("tool_result_truncated")
        content += piece
        current += cost
        tools_tokens += cost
        tools_used += 1

    # Memory: facts first, then recalled memories in rank order, within the memory share.
    memory_budget = int(max_tokens * req.shares.memory)
    memory_tokens = 0
    used = {"facts": 0, "memories": 0}
    for kind, header, lines in (("facts", FACTS_HEADER, req.facts), ("memories", MEMORIES_HEADER, req.memories)):
        for line in lines:
            piece = ("" if used[kind] else header) + f"\n- {line}"
            cost = grown(piece)
            if cost > min(memory_budget - memory_tokens, room()):
                break
            content += piece
            current += cost
            memory_tokens += cost
            used[kind] += 1

    # History: every token left, newest block first, contiguous.
    remaining = limit - current - fixed
    chosen: list[list[dict[str, Any]]] = []
    history_tokens = 0
    for block, tokens in zip(reversed(blocks), reversed(block_tokens), strict=False):
        if tokens > remaining - history_tokens:
            break
        chosen.append(block)
        history_tokens += tokens
    chosen.reverse()
    kept = [turn for block in chosen for turn in block]

    messages = [{"role": "system", "content": content}] + [_public(t) for t in kept]
    # Special tokens split the text, so the prompt's tokens are exactly the sum of its parts (tests
    # check it against a full count); counting the whole prompt again cost as much as building it.
    defined = _appended_tokens(content, tool_definitions) if tool_definitions else 0
    total = current + history_tokens + template + defined
    if total > limit:  # pragma: no cover - the choices above make this unreachable; never return over budget
        raise BudgetError("context does not fit", {"total": total, "limit": limit})

    sections = {
        "system": Section(system_tokens, int(max_tokens * req.shares.system)),
        "memory": Section(memory_tokens, memory_budget),
        "summary": Section(summary_tokens, 0),
        "history": Section(history_tokens, limit - system_tokens - tools_tokens - memory_tokens - template),
        "tool_results": Section(tools_tokens, tools_budget),
        "template": Section(template, template),
        "tool_definitions": Section(defined, defined),
        "output_reserved": Section(reserve, reserve),
    }
    return ContextResult(
        messages=messages,
        total_tokens=total,
        limit=limit,
        reserve_output=reserve,
        omitted_turns=len(req.turns) - len(kept),
        included_seqs=[int(t["seq"]) for t in kept if "seq" in t],
        facts_used=used["facts"],
        memories_used=used["memories"],
        tool_results_used=tools_used,
        sections=sections,
        notes=notes,
    )
