"""Fit a prompt into a token budget with exact Qwen2.5 counts. Pure: no I/O.

Claims, in order: the system prompt, tool definitions and the newest turn (mandatory, whole); then
each section up to its share (summary and turns: history; tool results; standing instructions,
facts and memories: memory, the standing ones up to `standing_share` of memory's grant); then what
is left flows to memory, as far as its memories passed the relevance floors, and last to history,
older turns first in line. A tool call is never split from its results, turns are never cut, and
the prompt never exceeds max_tokens - reserve.

Why memory before history: history's share already holds the recent turns, and an older turn is
only older; a memory that passed the floors was chosen for this query. History keeps its share
against memory, so a long conversation is not pushed out by recall.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from serve_app.core import memory_lines, tokenizer
from serve_app.core.memory_lines import MemoryItem
from serve_app.core.tokenizer import count_block, count_tokens
from serve_app.errors import BudgetError

FACTS_HEADER = "\n\n# Known facts about the user"
STANDING_HEADER = "\n\n# Standing instructions and preferences of the user"
SUMMARY_HEADER = "\n\n# Summary of the earlier part of this conversation\n"
TOOLS_HEADER = "\n\n# Tool results\n"
MIN_TRUNCATED_TOOL_TOKENS = 16
CHARS_PER_TOKEN = 3.5
"""Above this many characters per token of room, memories are not tried all at once (a guess that
only saves a count: the choice is the same either way)."""
# The tool definitions follow the system section, whose last characters can merge with their first
# newlines when tokenized: reserved with this margin, then counted exactly.
TOOL_DEFINITIONS_MARGIN = 4


class BudgetShares(BaseModel):
    """Share of `max_tokens` each section may claim before what is left is shared out (memory first,
    then history). The one definition: settings, requests and the builder all use it. The system
    prompt has no share: it always goes in whole."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    memory: float = Field(0.12, ge=0, le=1, description="Facts and recalled memories, before the spill.")
    history: float = Field(
        0.62, ge=0, le=1, description="Session summary and recent turns: what memory's spill cannot take from them."
    )
    tools: float = Field(0.12, ge=0, le=1, description="Tool results of the request; they take no spill.")
    output: float = Field(0.06, ge=0, le=1, description="Reserved for the model's answer.")

    @model_validator(mode="before")
    @classmethod
    def _no_system_share(cls, data: Any) -> Any:
        if isinstance(data, dict) and "system" in data:
            raise ValueError(
                "shares.system is not a share: the system prompt always goes in whole, and what it leaves flows "
                "to memory, then history; leave it out"
            )
        return data

    @model_validator(mode="after")
    def _sum_at_most_one(self) -> BudgetShares:
        total = self.memory + self.history + self.tools + self.output
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
    memories: Sequence[MemoryItem] = ()
    """Recalled memories best first, all past the relevance floors: the builder takes them in this order."""
    tool_results: Sequence[dict[str, Any]] = ()
    tools: Sequence[dict[str, Any]] = ()
    """Tool definitions of a chat request: the template renders them after the system prompt."""
    standing: Sequence[str] = ()
    """Standing instructions and preferences that bear on the request, first in line first: a section of
    their own before the facts, because they bear on the request whether or not its words match them."""
    standing_share: float = 0.25
    """The most of memory's grant the standing section takes: the rest is left to what answers the query."""
    standing_said: Sequence[str] = ()
    """What each standing line says in the user's words (its rule, without its date): a recalled turn
    that says the same is not quoted again under the memories when its line is in the prompt."""


Reason = Literal["mandatory", "all_fit", "room", "empty"]
"""Why a section holds what it holds: it must be whole, all it had fit, its grant ran out, it had nothing."""


@dataclass
class Section:
    tokens: int = 0
    budget: int = 0
    """Tokens the section was granted: its share plus what flowed to it."""
    share: int = 0
    reason: Reason = "all_fit"


@dataclass
class ContextResult:
    messages: list[dict[str, Any]]
    total_tokens: int
    limit: int
    reserve_output: int
    omitted_turns: int
    included_seqs: list[int]
    facts_used: int
    memories_used: list[int]
    """Indexes into the request's memories of those the prompt holds (near-duplicates are skipped)."""
    tool_results_used: int
    standing_used: int = 0
    """How many of the request's standing lines the prompt holds (the first ones)."""
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


_PUBLIC_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id")


def _public(turn: dict[str, Any]) -> dict[str, Any]:
    """The turn as a chat message: its set fields, and content always a string."""
    message = {k: value for k in _PUBLIC_FIELDS if (value := turn.get(k)) is not None and value != []}
    message["content"] = turn.get("content") or ""
    return message


def _system_tokens(content: str) -> int:
    return count_tokens(f"<|im_start|>system\n{content}<|im_end|>\n")


_BEFORE_LINE_START = re.compile(r"\n(?=\S)")
"""A newline before a line that starts with a non-space character (`\\S` is `not str.isspace()`).
Matched from its newline, not split after it by a look-behind: a look-behind is tried at every
character, and the memory section is kilobytes."""


def _lines(text: str) -> list[str]:
    """`text` cut where a line that starts with a non-space character begins, each newline kept
    with the line it ends."""
    pieces = _BEFORE_LINE_START.split(text)
    return [piece + "\n" for piece in pieces[:-1]] + pieces[-1:]


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
    per line would cost the square of its length.

    For the same reason (`_last_line_start`) no token crosses a line start inside `extra` either,
    so it is counted line by line through the count cache: the memory section is a new combination
    of lines on every request, but its lines (a user's memories, a session's summary) recur."""
    prefix = "system\n" + content  # the text between <|im_start|> and <|im_end|>
    tail = prefix[_last_line_start(prefix) :]
    lines = _lines(tail + extra)
    return sum(count_tokens(line) for line in lines) - count_tokens(tail)


def _truncate_to_tokens(text: str, max_tokens: int) -> str:
    ids = tokenizer.encode(text)
    if len(ids) <= max_tokens:
        return text
    cut = tokenizer.qwen25_encoding().decode(ids[: max(0, max_tokens - 2)])
    return cut + " …"


def _tool_piece(index: int, result: dict[str, Any], content: str | None = None) -> str:
    name = result.get("name") or "tool"
    text = str(result.get("content", "")) if content is None else content
    return ("" if index else TOOLS_HEADER) + f'<tool_response name="{name}">\n{text}\n</tool_response>\n'


def _fact_piece(index: int, line: str) -> str:
    return ("" if index else FACTS_HEADER) + f"\n- {line}"


def _standing_piece(index: int, line: str) -> str:
    return ("" if index else STANDING_HEADER) + f"\n- {line}"


def _history_within(block_tokens: Sequence[int], budget: int) -> int:
    """Tokens of the newest contiguous blocks that fit in `budget`: what history takes of it."""
    taken = 0
    for tokens in reversed(block_tokens):
        if tokens > budget - taken:
            break
        taken += tokens
    return taken


@dataclass
class _Memories:
    """The memory lines chosen, in rank order, with an estimate of their rendered cost."""

    chosen: list[int] = field(default_factory=list)
    groups: set[tuple[str, str, str]] = field(default_factory=set)
    estimate: int = 0
    exhausted: bool = True


@lru_cache(maxsize=4096)
def _header_tokens(day: str, space: str = "") -> int:
    return count_tokens(memory_lines.group_header(day, space))


def _distinct(items: Sequence[MemoryItem]) -> list[int]:
    """Indexes of the memories in rank order, each near-duplicate of a better-ranked one left out."""
    seen: set[str] = set()
    kept = []
    for index, item in enumerate(items):
        key = memory_lines.duplicate_key(item.text)
        if key not in seen:
            seen.add(key)
            kept.append(index)
    return kept


def _choose_memories(items: Sequence[MemoryItem], candidates: Sequence[int], allowed: int, costs: dict[int, int]) -> _Memories:
    """Memories in rank order while their estimated cost fits `allowed`. Each line is counted alone
    (once: `costs` keeps the counts between calls); where it meets its neighbour the count can
    differ by a token, which the exact count of the rendered section settles."""
    picked = _Memories(estimate=count_tokens(memory_lines.MEMORIES_HEADER) if candidates else 0)
    for index in candidates:
        item = items[index]
        if index not in costs:
            costs[index] = count_tokens(memory_lines.item_line(item))
        cost = costs[index] + (0 if item.group in picked.groups else _header_tokens(item.day, item.space))
        if picked.estimate + cost > allowed:
            picked.exhausted = False
            break
        picked.chosen.append(index)
        picked.groups.add(item.group)
        picked.estimate += cost
    if not picked.chosen:
        picked.estimate = 0
    return picked


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
    shares = {
        "memory": int(max_tokens * req.shares.memory),
        "history": int(max_tokens * req.shares.history),
        "tool_results": int(max_tokens * req.shares.tools),
    }
    notes: list[str] = []
    content = system_text
    current = system_tokens

    def grown(extra: str) -> int:
        return _appended_tokens(content, extra)

    def room() -> int:
        return limit - current - fixed - newest

    # What the sections after the summary claim of their shares, so that the summary (history,
    # first in the system message) leaves it to them. Estimates, each piece counted alone.
    # Only a summary or tool results can take what memory would claim: without them, no estimate.
    distinct = _distinct(req.memories)
    line_costs: dict[int, int] = {}
    tools_claim = 0
    for i, result in enumerate(req.tool_results):  # counted only until the share is reached: min() below
        if tools_claim >= shares["tool_results"]:
            break
        tools_claim += count_tokens(_tool_piece(i, result))
    tools_claim = min(shares["tool_results"], tools_claim)
    memory_claim = 0
    if req.summary or req.tool_results:
        standing_estimate = 0
        for i, line in enumerate(req.standing):  # up to its cap of memory's share: min() below
            if standing_estimate >= shares["memory"] * req.standing_share:
                break
            standing_estimate += count_tokens(_standing_piece(i, line))
        standing_estimate = min(int(shares["memory"] * req.standing_share), standing_estimate)
        facts_estimate = sum(count_tokens(_fact_piece(i, line)) for i, line in enumerate(req.facts))
        listed = standing_estimate + facts_estimate
        wanted = _choose_memories(req.memories, distinct, max(0, shares["memory"] - listed), line_costs).estimate
        memory_claim = min(shares["memory"], listed + wanted)

    # Summary: history's, before any older turn; it leaves the others their claims.
    summary_tokens = 0
    summary_grant = max(0, room() - tools_claim - memory_claim)
    if req.summary:
        section = SUMMARY_HEADER + req.summary
        cost = grown(section)
        if cost > summary_grant:
            section = SUMMARY_HEADER + _truncate_to_tokens(req.summary, max(0, summary_grant - 16))
            cost = grown(section)
            notes.append("summary_truncated")
        if cost <= summary_grant:
            content += section
            current += cost
            summary_tokens = cost

    # Tool results: up to their share (and the memory claim); the one that overflows is cut, the rest dropped.
    tools_grant = max(0, min(shares["tool_results"], room() - memory_claim))
    tools_tokens = 0
    tools_used = 0
    for i, result in enumerate(req.tool_results):
        piece = _tool_piece(i, result)
        cost = grown(piece)
        allowed = tools_grant - tools_tokens
        if cost > allowed:
            keep = allowed - (cost - count_tokens(str(result.get("content", ""))))
            if keep < MIN_TRUNCATED_TOOL_TOKENS:
                break
            piece = _tool_piece(i, result, _truncate_to_tokens(str(result.get("content", "")), keep - 2))
            cost = grown(piece)
            if cost > allowed:
                break
            notes.append("tool_result_truncated")
        content += piece
        current += cost
        tools_tokens += cost
        tools_used += 1

    # Memory: its share and the spill, all but what history takes of its own share.
    history_claim = _history_within(block_tokens[:-1], max(0, shares["history"] - newest - summary_tokens))
    memory_grant = max(0, room() - history_claim)
    memory_tokens = 0

    def take_lines(lines: Sequence[str], piece_of: Callable[[int, str], str], cap: int) -> int:
        """The lines, in order, while the memory section stays within `cap`; how many went in."""
        nonlocal content, current, memory_tokens
        for i, line in enumerate(lines):
            piece = piece_of(i, line)
            cost = grown(piece)
            if cost > cap - memory_tokens:
                return i
            content += piece
            current += cost
            memory_tokens += cost
        return len(lines)

    # Standing instructions first, up to their share of the grant, in the order given; then the facts.
    standing_used = take_lines(req.standing, _standing_piece, min(memory_grant, int(memory_grant * req.standing_share)))
    if standing_used and req.standing_said:
        shown = {memory_lines.duplicate_key(said) for said in req.standing_said[:standing_used]}
        distinct = [i for i in distinct if memory_lines.said_key(req.memories[i]) not in shown]
    facts_used = take_lines(req.facts, _fact_piece, memory_grant)
    # All of them at once when they fit (one count), else line by line in rank order.
    picked = _Memories(chosen=list(distinct))
    first_try = True
    if sum(len(req.memories[i].text) for i in distinct) > CHARS_PER_TOKEN * (memory_grant - memory_tokens):
        picked, first_try = _choose_memories(req.memories, distinct, memory_grant - memory_tokens, line_costs), False
    while picked.chosen:
        section = memory_lines.render([req.memories[i] for i in picked.chosen])
        cost = grown(section)
        if cost <= memory_grant - memory_tokens:
            content += section
            current += cost
            memory_tokens += cost
            break
        if first_try:  # not all of them: choose by the estimate
            picked = _choose_memories(req.memories, distinct, memory_grant - memory_tokens, line_costs)
            first_try = False
        else:
            picked.chosen.pop()  # the estimate was a token short: the lowest-ranked goes
            picked.exhausted = False

    # History: every token left, newest block first, contiguous.
    history_grant = limit - current - fixed
    chosen: list[list[dict[str, Any]]] = []
    history_tokens = 0
    for block, tokens in zip(reversed(blocks), reversed(block_tokens), strict=False):
        if tokens > history_grant - history_tokens:
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

    def reason(had: bool, used_all: bool) -> Reason:
        return "empty" if not had else "all_fit" if used_all else "room"

    memory_all = standing_used == len(req.standing) and facts_used == len(req.facts) and picked.exhausted
    memory_had = bool(req.standing or req.facts or req.memories)
    sections = {
        "system": Section(system_tokens, system_tokens, 0, "mandatory"),
        "memory": Section(memory_tokens, memory_grant, shares["memory"], reason(memory_had, memory_all)),
        "summary": Section(summary_tokens, summary_grant, 0, reason(bool(req.summary), "summary_truncated" not in notes)),
        "history": Section(history_tokens, history_grant, shares["history"], reason(bool(blocks), len(chosen) == len(blocks))),
        "tool_results": Section(
            tools_tokens,
            tools_grant,
            shares["tool_results"],
            reason(bool(req.tool_results), tools_used == len(req.tool_results) and "tool_result_truncated" not in notes),
        ),
        "template": Section(template, template, 0, "mandatory"),
        "tool_definitions": Section(defined, defined, 0, "mandatory" if defined else "empty"),
        "output_reserved": Section(reserve, reserve, reserve, "mandatory"),
    }
    return ContextResult(
        messages=messages,
        total_tokens=total,
        limit=limit,
        reserve_output=reserve,
        omitted_turns=len(req.turns) - len(kept),
        included_seqs=[int(t["seq"]) for t in kept if "seq" in t],
        facts_used=facts_used,
        memories_used=picked.chosen,
        tool_results_used=tools_used,
        standing_used=standing_used,
        sections=sections,
        notes=notes,
    )
