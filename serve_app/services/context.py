"""Assemble working memory for one request: fetch the three layers concurrently, then budget them.

A read never fails because long-term memory is unavailable: that part is skipped and named in
`degraded`. Only the session log (the conversation itself) is required.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import UTC
from typing import Any

from serve_app.core.budget import ContextRequest, build_context
from serve_app.core.clock import iso_day
from serve_app.core.memory_lines import MemoryItem, passage_item
from serve_app.core.records import MAX_TEXT_BYTES, Hit, clip_utf8
from serve_app.core.spaces import space_of
from serve_app.core.standing import STANDING_CATEGORIES, bears_on, key_words
from serve_app.errors import SessionOwnerError
from serve_app.runtime import tracing
from serve_app.schemas import ContextRequestIn, ContextResponse, ContextUsage, SectionUsage
from serve_app.services.dependencies import Dependencies
from serve_app.services.memories import hits_out
from serve_app.services.recall import recall
from serve_app.services.users import fact_out
from serve_app.stores.facts import Fact

logger = logging.getLogger("ray.serve")


def memory_item(hit: Hit) -> MemoryItem:
    day = iso_day(hit.created_at_ms) if hit.created_at_ms else "undated"
    space = space_of(hit.owner) or "" if hit.owner else ""
    if (place := hit.place) is not None:
        return passage_item(hit.role, hit.text, day, hit.session_id, hit.seq, *place, space)
    text = f"{hit.role}: {hit.text}" if hit.kind == "turn" else hit.text
    return MemoryItem(text, day, hit.session_id, hit.seq, hit.kind, space=space)


def _said_in(hit: Hit, history: dict[int, str]) -> bool:
    """Whether a turn memory (or a passage of one) is of a turn the history section holds."""
    said = history.get(hit.seq) if hit.kind == "turn" else None
    if said is None:
        return False
    return hit.text in said if hit.place is not None else hit.text == clip_utf8(said, MAX_TEXT_BYTES)


def fact_line(fact: Fact, space: str = "") -> str:
    """A fact as the prompt shows it; a space's names the space."""
    return f"{f'[space {space}] ' if space else ''}{fact.key} ({fact.category}): {fact.value}"


def standing_line(fact: Fact, space: str = "") -> str:
    """A standing rule as the prompt shows it: dated by when the user said it, so that of two that
    disagree the later is known however late either was memorized."""
    return f"[{fact.since.astimezone(UTC).date().isoformat()}{f', space {space}' if space else ''}] {fact.value}"


def split_standing(facts: Sequence[Fact], query: str) -> tuple[list[Fact], list[Fact]]:
    """(standing, others): the instructions and preferences that bear on the query, the latest said first (a
    capped section keeps the latest word), and the facts of the other categories. A standing rule
    that does not bear on the query is in neither: every rule in every prompt is noise."""
    standing = [
        f for f in facts if f.category in STANDING_CATEGORIES and bears_on(f.value, f.category, query, about=key_words(f.key))
    ]
    standing.sort(key=lambda f: f.since, reverse=True)
    return standing, [f for f in facts if f.category not in STANDING_CATEGORIES]


async def build_working_memory(
    deps: Dependencies,
    tenant: str,
    req: ContextRequestIn,
    *,
    pending_turns: Sequence[dict[str, Any]] = (),
    tools: Sequence[dict[str, Any]] = (),
    history_upto: int | None = None,
    shared: Sequence[str] = (),
) -> ContextResponse:
    """The prompt for the next call and what went into it, section by section. `pending_turns`: a
    chat call's own turns, after the log's; `history_upto`: the log's last seq that call saw (turns
    that other calls append meanwhile stay out of its prompt, which ends with its own newest turn);
    `tools`: a chat call's tool definitions, which take room in the prompt; `shared`: the owner ids
    of the spaces the caller may read and named (services.spaces.readable)."""
    attributes = {
        "memory.operation": "context",
        "memory.tenant": tenant,
        "memory.user": req.user_id,
        "memory.session": req.session_id,
    }
    with tracing.span("memory.context", attributes=attributes) as span:
        response = await _build(deps, tenant, req, pending_turns, tools, history_upto, shared)
        if span.is_recording():
            span.set_attributes(
                {
                    "memory.recalled": len(response.recalled),
                    "memory.facts": len(response.facts) + len(response.standing),
                    "memory.prompt_tokens": response.usage.sections["memory"].tokens,
                    "memory.summary_tokens": response.usage.sections["summary"].tokens,
                    "memory.context_tokens": response.usage.total_tokens,
                    "memory.degraded": response.degraded,
                }
            )
        return response


async def _build(
    deps: Dependencies,
    tenant: str,
    req: ContextRequestIn,
    pending_turns: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]],
    history_upto: int | None,
    shared: Sequence[str] = (),
) -> ContextResponse:
    stores, settings = deps.stores, deps.settings
    degraded: list[str] = []
    top_k = settings.recall_top_k if req.top_k is None else req.top_k
    min_score = settings.recall_min_score if req.min_score is None else req.min_score

    fact_space: dict[int, str] = {}  # id of a space's fact -> its space

    async def session_part():
        meta, turns = await stores.log.uncovered(tenant, req.session_id, upto=history_upto)
        if meta is not None and meta.user_id != req.user_id:
            raise SessionOwnerError(meta.user_id)
        return meta, turns

    async def recall_part() -> list[Hit]:
        try:
            found = await recall(
                stores,
                deps.embed_one,
                tenant,
                req.user_id,
                req.query,
                # Room for the session's own turns dropped below, within the candidates each side
                # gives anyway: more would make both searches return more than the prompt uses.
                top_k=min(top_k + 8, max(top_k, settings.recall_candidates)) if top_k else 0,
                settings=settings,
                min_score=min_score,
                observe_ms=deps.observe_recall("context", tenant),
                shared=shared,
            )
        except Exception as exc:
            logger.warning("recall unavailable: %r", exc)
            degraded.append("recall_unavailable")
            return []
        degraded.extend(found.degraded)
        return found.hits

    async def facts_part() -> list[Fact]:
        try:
            if not shared:
                return await stores.facts.current(tenant, req.user_id)
            found = await asyncio.gather(*(stores.facts.current(tenant, owner) for owner in [req.user_id, *shared]))
            for owner, owned in zip(shared, found[1:], strict=True):
                fact_space.update((id(f), space_of(owner) or "") for f in owned)
            return [f for owned in found for f in owned]
        except Exception as exc:
            logger.warning("facts unavailable: %r", exc)
            degraded.append("facts_unavailable")
            return []

    (meta, turns), hits, facts = await asyncio.gather(session_part(), recall_part(), facts_part())
    # Turns in the history section are not recalled twice. By seq and text, not by seq alone: under
    # a session id used again after its log expired, the old conversation's seqs are not this one's.
    in_history = {t["seq"]: t.get("content") or "" for t in turns}
    hits = [h for h in hits if not (h.session_id == req.session_id and _said_in(h, in_history))]
    if settings.recall_rerank:  # the scores are the second stage's probabilities
        floor = settings.context_min_probability if req.min_probability is None else req.min_probability
        hits = [h for h in hits if h.score >= floor]
    hits = hits[:top_k]
    standing, facts = split_standing(facts, req.query)
    shares = req.shares or settings.shares
    max_tokens = req.max_tokens or settings.default_max_tokens
    result = build_context(
        ContextRequest(
            max_tokens=max_tokens,
            shares=shares,
            system_prompt=req.system_prompt,
            reserve_output=req.reserve_output,
            summary=meta.summary if meta and meta.summary else None,
            turns=[*turns, *pending_turns],
            facts=[fact_line(f, fact_space.get(id(f), "")) for f in facts],
            memories=[memory_item(h) for h in hits],
            tool_results=[r.model_dump() for r in req.tool_results],
            tools=tools,
            standing=[standing_line(f, fact_space.get(id(f), "")) for f in standing],
            standing_share=settings.context_standing_share,
            standing_said=[f.value for f in standing],
        )
    )
    if meta and meta.summary_degraded:
        degraded.append("summary_degraded")
    degraded.extend(result.notes)
    deps.observers.context_sections(result.total_tokens, {k: v.tokens for k, v in result.sections.items()})
    return ContextResponse(
        messages=result.messages,
        usage=ContextUsage(
            total_tokens=result.total_tokens,
            max_tokens=max_tokens,
            reserve_output=result.reserve_output,
            limit=result.limit,
            omitted_turns=result.omitted_turns,
            percent_used=round(100.0 * result.total_tokens / max_tokens, 2),
            sections={
                k: SectionUsage(tokens=v.tokens, budget=v.budget, share=v.share, reason=v.reason)
                for k, v in result.sections.items()
            },
        ),
        recalled=hits_out([hits[i] for i in result.memories_used]),
        facts=[fact_out(f, fact_space.get(id(f))) for f in facts[: result.facts_used]],
        standing=[fact_out(f, fact_space.get(id(f))) for f in standing[: result.standing_used]],
        summary_included=result.sections["summary"].tokens > 0,
        included_seqs=result.included_seqs,
        degraded=degraded,
    )
