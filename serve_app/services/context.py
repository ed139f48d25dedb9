"""Assemble working memory for one request: fetch the three layers concurrently, then budget them.

A read never fails because long-term memory is unavailable: that part is skipped and named in
`degraded`. Only the session log (the conversation itself) is required.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timezone

from serve_app.core.budget import BudgetError, ContextRequest, Shares, build_context
from serve_app.schemas import (
    ContextRequestIn,
    ContextResponse,
    ContextUsage,
    FactOut,
    SearchHit,
    SectionUsage,
)
from serve_app.services.recall import EmbedOne, recall
from serve_app.services.stores import Stores
from serve_app.settings import Settings
from serve_app.stores.facts import Fact
from serve_app.stores.session_log import SessionOwnerError
from serve_app.stores.vectors import Hit

logger = logging.getLogger("ray.serve")


def ms_to_datetime(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def hit_out(hit: Hit) -> SearchHit:
    return SearchHit(
        id=hit.id,
        text=hit.text,
        score=hit.score,
        session_id=hit.session_id,
        seq=hit.seq,
        created_at=ms_to_datetime(hit.created_at_ms),
    )


def memory_line(hit: Hit) -> str:
    day = ms_to_datetime(hit.created_at_ms).date().isoformat() if hit.created_at_ms else "undated"
    who = f"{hit.role}: " if hit.kind == "turn" else ""
    return f"[{day}] {who}{hit.text}"


def fact_line(fact: Fact) -> str:
    return f"{fact.key} ({fact.category}): {fact.value}"


def fact_out(fact: Fact) -> FactOut:
    return FactOut(**fact.__dict__)


async def build_working_memory(
    req: ContextRequestIn,
    tenant: str,
    stores: Stores,
    embed_one: EmbedOne,
    settings: Settings,
    observe_recall_ms: Callable[[float], None] | None = None,
) -> ContextResponse:
    degraded: list[str] = []
    top_k = settings.recall_top_k if req.top_k is None else req.top_k
    min_score = settings.recall_min_score if req.min_score is None else req.min_score

    async def session_part():
        meta = await stores.log.meta(tenant, req.session_id)
        if meta is None:
            return None, []
        if meta.user_id != req.user_id:
            raise SessionOwnerError(meta.user_id)
        return meta, await stores.log.read(tenant, req.session_id, after=meta.covers_upto_seq)

    async def recall_part() -> list[Hit]:
        try:
            found = await recall(
                stores,
                embed_one,
                tenant,
                req.user_id,
                req.query,
                top_k=top_k + 8 if top_k else 0,  # room for the session's own turns dropped below
                settings=settings,
                min_score=min_score,
                observe_ms=observe_recall_ms,
            )
        except Exception as exc:
            logger.warning("recall unavailable: %r", exc)
            degraded.append("recall_unavailable")
            return []
        degraded.extend(found.degraded)
        return found.hits

    async def facts_part() -> list[Fact]:
        try:
            return await stores.facts.current(tenant, req.user_id)
        except Exception as exc:
            logger.warning("facts unavailable: %r", exc)
            degraded.append("facts_unavailable")
            return []

    (meta, turns), hits, facts = await asyncio.gather(session_part(), recall_part(), facts_part())
    covers = meta.covers_upto_seq if meta else 0
    # Raw turns of this session past the checkpoint are history already: do not recall them twice.
    hits = [h for h in hits if not (h.session_id == req.session_id and h.kind == "turn" and h.seq > covers)][:top_k]
    shares = req.shares or settings.shares
    max_tokens = req.max_tokens or settings.default_max_tokens
    result = build_context(
        ContextRequest(
            max_tokens=max_tokens,
            shares=Shares(**shares.model_dump()),
            system_prompt=req.system_prompt,
            reserve_output=req.reserve_output,
            summary=meta.summary if meta and meta.summary else None,
            turns=turns,
            facts=[fact_line(f) for f in facts],
            memories=[memory_line(h) for h in hits],
            tool_results=[r.model_dump() for r in req.tool_results],
        )
    )
    if meta and meta.summary_degraded:
        degraded.append("summary_degraded")
    degraded.extend(result.notes)
    return ContextResponse(
        messages=result.messages,
        usage=ContextUsage(
            total_tokens=result.total_tokens,
            max_tokens=max_tokens,
            reserve_output=result.reserve_output,
            limit=result.limit,
            omitted_turns=result.omitted_turns,
            percent_used=round(100.0 * result.total_tokens / max_tokens, 2),
            sections={k: SectionUsage(tokens=v.tokens, budget=v.budget) for k, v in result.sections.items()},
        ),
        recalled=[hit_out(h) for h in hits[: result.memories_used]],
        facts=[fact_out(f) for f in facts[: result.facts_used]],
        summary_included=result.sections["summary"].tokens > 0,
        included_seqs=result.included_seqs,
        degraded=degraded,
    )


__all__ = ["BudgetError", "build_working_memory"]
