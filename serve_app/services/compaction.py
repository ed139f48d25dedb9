"""Compaction of one session: plan (pure), summarize, write the checkpoint by compare-and-set."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum

from serve_app.core.budget import group_blocks
from serve_app.core.compression import SummaryState, plan_compaction
from serve_app.core.tokenizer import count_block, count_tokens
from serve_app.errors import CompactionConflict, SessionNotFound
from serve_app.services.summarizer import Summarizer, SummaryOutcome
from serve_app.stores.session_log import SessionLog

logger = logging.getLogger("ray.serve")
MAX_CAS_ATTEMPTS = 8


@dataclass
class CompactionOutcome:
    compacted: bool
    summary_text: str
    covers_upto_seq: int
    tokens_before: int
    tokens_after: int
    cas_conflicts: int
    degraded: bool = False
    summary: SummaryOutcome | None = None

    def public(self) -> dict:
        """The fields of the HTTP response."""
        return {
            "compacted": self.compacted,
            "summary": self.summary_text,
            "covers_upto_seq": self.covers_upto_seq,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "cas_conflicts": self.cas_conflicts,
            "degraded": self.degraded,
        }


def history_tokens(turns: list[dict]) -> int:
    return sum(count_block(block) for block in group_blocks(turns))


async def compact_session(
    log: SessionLog,
    tenant: str,
    session: str,
    *,
    summarizer: Summarizer,
    trigger_tokens: int,
    keep_rounds: int,
    force: bool,
    on_conflict=lambda: None,
) -> CompactionOutcome:
    """Fold everything but the newest rounds into the summary; never deletes a message.

    Appends that land meanwhile are untouched (the log only grows); a concurrent compaction makes
    our compare-and-set fail, and we re-plan from the checkpoint it wrote.
    """
    conflicts = 0
    for _ in range(MAX_CAS_ATTEMPTS):
        meta = await log.meta(tenant, session)
        if meta is None:
            raise SessionNotFound(session)
        turns = await log.read(tenant, session, after=meta.covers_upto_seq)
        unsummarized = history_tokens(turns)
        summary_tokens = count_tokens(meta.summary) if meta.summary else 0
        target = plan_compaction(turns, unsummarized, trigger_tokens=trigger_tokens, keep_rounds=keep_rounds, force=force)
        if target is None:
            before = summary_tokens + unsummarized
            return CompactionOutcome(False, meta.summary, meta.covers_upto_seq, before, before, conflicts)
        span = [t for t in turns if t["seq"] <= target]
        previous = SummaryState.from_dict(meta.summary_state)
        made = await summarizer.summarize(previous, meta.summary, span, target)
        text = made.text
        version = await log.write_checkpoint(
            tenant,
            session,
            expected_version=meta.version,
            summary=text,
            covers_upto_seq=target,
            degraded=made.degraded,
            state=made.state.to_dict(),
        )
        if version is None:
            conflicts += 1
            on_conflict()
            continue
        tail = [t for t in turns if t["seq"] > target]
        outcome = CompactionOutcome(
            True,
            text,
            target,
            summary_tokens + unsummarized,
            count_tokens(text) + history_tokens(tail),
            conflicts,
            made.degraded,
            made,
        )
        logger.info(
            "compacted session",
            extra={
                "session_id": session,
                "covers_upto_seq": target,
                "tokens_before": outcome.tokens_before,
                "tokens_after": outcome.tokens_after,
            },
        )
        return outcome
    raise CompactionConflict(f"compaction of {session} lost {conflicts} compare-and-set races")


class Redo(Enum):
    """What `redo_degraded` did with a session's checkpoint."""

    NOT_NEEDED = "not needed"  # not degraded, no LLM, or nothing covered yet
    REDONE = "redone"  # the LLM rewrote the summary over the same turns
    STILL_DEGRADED = "still degraded"  # the LLM failed again, or a newer checkpoint won


async def redo_degraded(log: SessionLog, tenant: str, session: str, *, summarizer: Summarizer) -> Redo:
    """Rebuild a degraded (extractive fallback) checkpoint with the LLM, covering the same turns."""
    meta = await log.meta(tenant, session)
    if meta is None or not meta.summary_degraded or not summarizer.uses_llm or meta.covers_upto_seq == 0:
        return Redo.NOT_NEEDED
    covered = await log.read(tenant, session, after=0, limit=meta.covers_upto_seq)
    made = await summarizer.summarize(SummaryState(), "", covered, meta.covers_upto_seq)
    if made.degraded:
        return Redo.STILL_DEGRADED
    version = await log.write_checkpoint(
        tenant,
        session,
        expected_version=meta.version,
        summary=made.text,
        covers_upto_seq=meta.covers_upto_seq,
        degraded=False,
        state=made.state.to_dict(),
    )
    return Redo.REDONE if version is not None else Redo.STILL_DEGRADED
