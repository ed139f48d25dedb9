"""Compaction of one session: plan (pure), summarize, write the checkpoint by compare-and-set."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from serve_app.core.budget import group_blocks
from serve_app.core.compression import SummaryState, extractive_summary, plan_compaction
from serve_app.core.tokenizer import count_block, count_tokens
from serve_app.stores.session_log import SessionLog

logger = logging.getLogger("ray.serve")
MAX_CAS_ATTEMPTS = 8


class SessionNotFound(LookupError):
    pass


class CompactionConflict(RuntimeError):
    """Every attempt lost the compare-and-set to another compactor."""


@dataclass
class CompactionOutcome:
    compacted: bool
    summary: str
    covers_upto_seq: int
    tokens_before: int
    tokens_after: int
    cas_conflicts: int


def history_tokens(turns: list[dict]) -> int:
    return sum(count_block(block) for block in group_blocks(turns))


async def compact_session(
    log: SessionLog,
    tenant: str,
    session: str,
    *,
    trigger_tokens: int,
    keep_rounds: int,
    summary_max_tokens: int,
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
        state, text = extractive_summary(previous, span, target, max_tokens=summary_max_tokens, count_tokens=count_tokens)
        version = await log.write_checkpoint(
            tenant,
            session,
            expected_version=meta.version,
            summary=text,
            covers_upto_seq=target,
            degraded=False,
            state=state.to_dict(),
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
