"""Memorization as cursors: embed turns after `memorized_upto_seq`, extract facts after
`extracted_upto_seq`, compact when due, redo degraded summaries once the LLM answers again.

At-least-once work with an exactly-once effect: vector ids are deterministic and a fact write that
repeats its value adds no row, so redoing a batch after a crash changes nothing; each cursor moves
only after its store confirmed the write, and never past work that failed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from serve_app.core.clock import iso_to_ms
from serve_app.core.ids import turn_memory_id
from serve_app.encoding import EmbedMany
from serve_app.llm.client import ChatCall, ChatClient, LLMError
from serve_app.llm.prompts import extraction_messages, parse_extraction, response_format
from serve_app.services.compaction import CompactionOutcome, compact_session, redo_degraded
from serve_app.services.memories import delete_memories, memory_row, save_memories
from serve_app.services.summarizer import Summarizer, chunk_span
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores

logger = logging.getLogger("ray.serve")
MEMORIZED_ROLES = ("user", "assistant")


def _said(turn: dict) -> bool:
    return turn["role"] in MEMORIZED_ROLES and bool((turn.get("content") or "").strip())


@dataclass
class MemorizeReport:
    """What one pass did, for metrics and tests."""

    cursor: int = 0
    embedded: int = 0
    compaction: CompactionOutcome | None = None
    facts_written: int = 0
    extraction_rejects: int = 0
    extraction_failed: bool = False
    redone: bool | None = None
    errors: list[str] = field(default_factory=list)


class SessionMemorizer:
    def __init__(self, stores: Stores, embed: EmbedMany, settings: Settings, llm: ChatClient | None = None):
        self.stores = stores
        self.log = stores.log
        self.vectors = stores.vectors
        self.facts = stores.facts
        self.embed = embed
        self.settings = settings
        self.llm = llm
        self.summarizer = Summarizer(
            llm,
            summary_max_tokens=settings.summary_max_tokens,
            llm_input_tokens=settings.llm_input_tokens,
            seed=settings.llm_seed,
        )
        self.extracts = llm is not None and settings.extraction_enabled

    async def compact(self, tenant: str, session: str, *, force: bool, on_conflict=lambda: None) -> CompactionOutcome:
        return await compact_session(
            self.log,
            tenant,
            session,
            summarizer=self.summarizer,
            trigger_tokens=self.settings.compaction_trigger_tokens,
            keep_rounds=self.settings.compaction_keep_rounds,
            force=force,
            on_conflict=on_conflict,
        )

    async def memorize(self, tenant: str, session: str, on_conflict=lambda: None) -> MemorizeReport:
        """Bring every cursor of the session to its last seq (as far as the LLM allows)."""
        report = MemorizeReport()
        batch = self.settings.memorizer_batch_size
        while True:
            meta = await self.log.meta(tenant, session)
            if meta is not None and await self.log.forgotten(tenant, meta.user_id, meta.created_at_ms):
                await self._erase(tenant, session)  # a session of a forgotten user that slipped through
                meta = None
            if meta is None:
                await self.log.advance_cursor(tenant, session, 0, done=True)  # drops it from pending
                report.cursor = -1
                return report
            turns = await self.log.read(tenant, session, after=meta.memorized_upto_seq, limit=batch)
            if turns:
                report.embedded += await self._embed_turns(tenant, session, meta.user_id, turns)
                if await self._gone(tenant, session, meta.user_id, meta.created_at_ms):
                    # Deleted or forgotten while we embedded: remove what we just wrote.
                    await self._erase(tenant, session)
                    report.cursor = -1
                    return report
            done = len(turns) < batch
            if done:
                if self.extracts:
                    await self._extract(tenant, session, meta.user_id, meta.created_at_ms, meta.extracted_upto_seq, report)
                report.compaction = await self.compact(tenant, session, force=False, on_conflict=on_conflict)
                if self.summarizer.uses_llm:
                    report.redone = await redo_degraded(self.log, tenant, session, summarizer=self.summarizer)
            upto = turns[-1]["seq"] if turns else meta.memorized_upto_seq
            report.cursor = await self.log.advance_cursor(
                tenant,
                session,
                upto,
                done=done,
                needs_extraction=self.extracts,
                needs_llm_summary=self.summarizer.uses_llm,
            )
            if done:
                return report

    async def _gone(self, tenant: str, session: str, user: str, created_at_ms: int) -> bool:
        return await self.log.meta(tenant, session) is None or await self.log.forgotten(tenant, user, created_at_ms)

    async def _erase(self, tenant: str, session: str) -> None:
        await self.log.delete(tenant, session)
        await delete_memories(self.stores, tenant, session=session)

    async def _embed_turns(self, tenant: str, session: str, user: str, turns: list[dict]) -> int:
        items = [t for t in turns if _said(t)]
        if not items:
            return 0
        vectors = await self.embed([t["content"] for t in items])
        context = await self._turns_before(tenant, session, turns[0]["seq"])
        rows = []
        for turn, vector in zip(items, vectors, strict=True):
            rows.append(
                memory_row(
                    self.settings,
                    memory_id=turn_memory_id(tenant, session, turn["seq"]),
                    tenant=tenant,
                    user=user,
                    text=turn["content"],
                    created_at_ms=iso_to_ms(turn.get("created_at")),
                    vector=vector,
                    session=session,
                    seq=turn["seq"],
                    role=turn["role"],
                    kind="turn",
                    before=[t["content"] for t in context[-self.settings.recall_keyword_context_turns :]]
                    if self.settings.recall_keyword_context_turns
                    else [],
                )
            )
            context.append(turn)
        await save_memories(self.stores, rows)
        return len(rows)

    async def _turns_before(self, tenant: str, session: str, seq: int) -> list[dict]:
        """The said turns just before `seq` that index a memory's keywords with their context."""
        wanted = self.settings.recall_keyword_context_turns
        if not wanted or seq <= 1:
            return []
        window = 4 * wanted  # tool messages in between do not count
        earlier = await self.log.read(tenant, session, after=max(0, seq - 1 - window), limit=min(window, seq - 1))
        return [t for t in earlier if _said(t) and t["seq"] < seq][-wanted:]

    async def _extract(
        self, tenant: str, session: str, user: str, created_at_ms: int, after: int, report: MemorizeReport
    ) -> None:
        """Facts from the turns after the extraction cursor, one chunk at a time; stops at a failure."""
        assert self.llm is not None
        turns = await self.log.read(tenant, session, after=after)
        if not turns:
            return
        for chunk in chunk_span(turns, self.settings.llm_input_tokens):
            said = [t for t in chunk if _said(t)]
            if said:
                known = [(f.key, f.value) for f in await self.facts.current(tenant, user)]
                call = ChatCall(
                    extraction_messages(known, said),
                    max_tokens=self.settings.llm_extract_max_tokens,
                    temperature=0.0,
                    seed=self.settings.llm_seed,
                    response_format=response_format(self.settings.extraction_max_facts),
                )
                try:
                    result = await self.llm.chat(call)
                    facts, rejected = parse_extraction(result.text, self.settings.extraction_max_facts)
                except LLMError as exc:  # the model is unreachable: retry later, never skip
                    logger.warning("extraction for %s/%s failed, retried later: %s", tenant, session, exc)
                    report.extraction_failed = True
                    report.errors.append(str(exc)[:200])
                    return
                except ValueError as exc:  # the model answered, but not the schema
                    attempts = await self.log.count_extraction_failure(tenant, session)
                    report.errors.append(str(exc)[:200])
                    if attempts < self.settings.extraction_max_attempts:
                        logger.warning("invalid extraction for %s/%s (attempt %d): %s", tenant, session, attempts, exc)
                        report.extraction_failed = True
                        return
                    logger.warning(
                        "skipping extraction of %s/%s up to seq %d after %d invalid outputs",
                        tenant,
                        session,
                        chunk[-1]["seq"],
                        attempts,
                    )
                    facts, rejected = [], 1
                report.extraction_rejects += rejected
                if await self._gone(tenant, session, user, created_at_ms):
                    return  # deleted or forgotten while the model thought: write nothing
                seqs = [t["seq"] for t in said]
                for fact in facts:
                    _, changed = await self.facts.put(
                        tenant, user, fact.key, fact.value, fact.category, source_session=session, source_seqs=seqs
                    )
                    report.facts_written += int(changed)
            await self.log.advance_cursor(tenant, session, chunk[-1]["seq"], done=False, cursor="extracted_upto_seq")
