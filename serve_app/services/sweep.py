"""The memorizer's schedule: which sessions to memorize, when, and what to do between sessions.

A timer sweeps two lanes in Redis (appends may also poke a session), so a lost poke or a crashed
replica only delays work: the next sweep redoes it from the session's cursors. The embedding lane
never calls the LLM; the LLM lane holds what sessions owe it, each due at its own time, so sessions
that back off while the LLM is down never crowd out the rest. After Milvus restarts, the vectors it
lost are repaired from PostgreSQL; new vectors are flushed on a timer. No Ray here: the Memorizer
deployment runs one of these per replica.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Protocol

from serve_app.encoding import EmbedMany
from serve_app.llm.client import ChatClient
from serve_app.runtime import tracing
from serve_app.services.compaction import CompactionOutcome
from serve_app.services.index_repair import move_vectors, reembed_vectors, reindex_keywords, repair_vectors
from serve_app.services.memorizer import MemorizeReport, SessionMemorizer
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores

logger = logging.getLogger("ray.serve")
MAX_BACKOFF_S = 60.0

Key = tuple[str, str]  # (tenant, session)


def _attributes(key: Key, operation: str = "memorize") -> dict[str, str]:
    return {"memory.operation": operation, "memory.tenant": key[0], "memory.session": key[1]}


def _report_on(span, report: MemorizeReport) -> None:
    if span.is_recording():
        span.set_attributes(
            {
                "memory.skipped": report.skipped,
                "memory.embedded": report.embedded,
                "memory.facts_written": report.facts_written,
                "memory.summaries": report.summaries,
                "memory.degraded": report.llm_trouble,
            }
        )


@dataclass(frozen=True)
class Backlog:
    """The embedding lane as the last sweep saw it: what the Memorizer's autoscaling follows."""

    waiting_sessions: int = 0
    lag_s: float = 0.0
    """Age of the oldest unmemorized turn in the lane."""


class SweepObservers(Protocol):
    """Where the memorizer's metrics go (Prometheus in a replica)."""

    def memorized(self, report: MemorizeReport, lag_s: float | None) -> None: ...

    def compacted(self, outcome: CompactionOutcome | None) -> None: ...

    def conflict(self) -> None: ...

    def pending(self, count: int) -> None: ...

    def llm_pending(self, count: int) -> None: ...

    def failed(self) -> None: ...

    def repaired(self, count: int) -> None: ...

    def reindexed(self, count: int) -> None: ...

    def reembedded(self, count: int) -> None: ...

    def moved(self, count: int) -> None: ...

    def unstorable(self, count: int) -> None: ...


class NoSweepObservers:
    def memorized(self, report: MemorizeReport, lag_s: float | None) -> None:
        pass

    def compacted(self, outcome: CompactionOutcome | None) -> None:
        pass

    def conflict(self) -> None:
        pass

    def pending(self, count: int) -> None:
        pass

    def llm_pending(self, count: int) -> None:
        pass

    def failed(self) -> None:
        pass

    def repaired(self, count: int) -> None:
        pass

    def reindexed(self, count: int) -> None:
        pass

    def reembedded(self, count: int) -> None:
        pass

    def moved(self, count: int) -> None:
        pass

    def unstorable(self, count: int) -> None:
        pass


class MemorizerSweep:
    def __init__(
        self,
        stores: Stores,
        embed: EmbedMany,
        settings: Settings,
        llm: ChatClient | None = None,
        observers: SweepObservers | None = None,
        pending_limit: int = 256,
    ):
        self.stores = stores
        self.embed = embed
        self.settings = settings
        self.observers = observers or NoSweepObservers()
        self.pending_limit = pending_limit
        self.logic = SessionMemorizer(stores, embed, settings, llm)
        self.running: dict[Key, asyncio.Task] = {}
        self.again: set[Key] = set()
        self.not_before: dict[Key, tuple[float, float]] = {}  # retry backoff of failed embedding passes
        self.llm_running: dict[Key, asyncio.Task] = {}
        self.asked_by: dict[Key, list] = {}  # links to the spans that poked a session, for its next pass
        self.unflushed = False
        self.last_flush = time.monotonic()
        self.repaired_reloads: int | None = None  # None: repair once at start (Milvus may have restarted meanwhile)
        self.repair: asyncio.Task | None = None
        self.reindex: asyncio.Task | None = None  # once per start: keywords or vectors of an older form
        self.backlog = Backlog()

    def schedule(self, tenant: str, session: str) -> asyncio.Task:
        """Memorize the session now, or once more when it is already running (new turns arrived)."""
        key = (tenant, session)
        if links := tracing.current_link():
            self.asked_by.setdefault(key, []).extend(links)
        task = self.running.get(key)
        if task is not None and not task.done():
            self.again.add(key)
            return task
        task = asyncio.create_task(self._run(key))
        self.running[key] = task
        return task

    async def _run(self, key: Key) -> MemorizeReport | None:
        report = None
        try:
            while True:
                self.again.discard(key)
                # A pass serves every write since the last: a trace of its own, linked to the
                # requests that asked for it (pokes; the sweep's own finds link to nothing).
                asked_by = self.asked_by.pop(key, [])
                with tracing.span("memory.memorize", root=True, links=asked_by, attributes=_attributes(key)) as span:
                    since_ms = await self.stores.log.pending_since_ms(*key)
                    report = await self.logic.memorize(*key, on_conflict=self.observers.conflict)
                    _report_on(span, report)
                if report.skipped:  # another worker holds it; what it leaves is still pending
                    break
                lag = max(0.0, time.time() - since_ms / 1000) if since_ms is not None and report.cursor >= 0 else None
                self.observers.memorized(report, lag)
                await self._count_llm_trouble(key[0], report)
                self.unflushed = self.unflushed or report.embedded > 0
                if key not in self.again:
                    break
            self.not_before.pop(key, None)
        except Exception:
            self.observers.failed()
            self._back_off(key)
            logger.exception("memorization of %s/%s failed; the sweep will retry from the cursor", *key)
        finally:
            self.running.pop(key, None)
        return report

    def _back_off(self, key: Key) -> None:
        _, delay = self.not_before.get(key, (0.0, self.settings.memorizer_sweep_interval_s))
        delay = min(MAX_BACKOFF_S, delay * 2)
        self.not_before[key] = (time.monotonic() + delay, delay)

    def schedule_llm(self, tenant: str, session: str) -> asyncio.Task:
        key = (tenant, session)
        task = self.llm_running.get(key)
        if task is None or task.done():
            task = self.llm_running[key] = asyncio.create_task(self._run_llm(key))
        return task

    async def _run_llm(self, key: Key) -> MemorizeReport | None:
        """One LLM pass; the lane in Redis keeps the session due again later if the LLM failed."""
        try:
            return await self._llm_pass(key)
        finally:
            self.llm_running.pop(key, None)

    async def _llm_pass(self, key: Key) -> MemorizeReport | None:
        report, ok, seen_len = None, False, 0
        try:
            with tracing.span("memory.catch_up_llm", root=True, attributes=_attributes(key, "catch_up_llm")) as span:
                meta = await self.stores.log.meta(*key)
                seen_len = meta.message_count if meta is not None else 0
                report = await self.logic.catch_up_llm(*key, on_conflict=self.observers.conflict)
                _report_on(span, report)
            if report.skipped:  # another worker holds the lane and records its own pass
                return report
            self.observers.memorized(report, None)
            await self._count_llm_trouble(key[0], report)
            ok = not report.llm_trouble
        except Exception:
            self.observers.failed()
            logger.exception("LLM work for %s/%s failed; retried later", *key)
        try:
            retry_ms = int(2000 * self.settings.memorizer_sweep_interval_s)
            await self.stores.log.llm_pass_done(*key, seen_len=seen_len, ok=ok, retry_ms=retry_ms)
        except Exception:  # the session stays due: the next sweep runs it again
            logger.exception("could not record the LLM pass of %s/%s", *key)
        return report

    async def compress(self, tenant: str, session: str) -> dict:
        """Compact now (the API's /compress), with the configured summarizer."""
        outcome = await self.logic.compact(tenant, session, force=True, on_conflict=self.observers.conflict)
        if outcome.compacted:  # a pass of its own brings the summary memories up to the new checkpoint
            self.schedule(tenant, session)
        self.observers.compacted(outcome)
        await self._count_llm_trouble(tenant, MemorizeReport(compaction=outcome))
        return outcome.public()

    async def _count_llm_trouble(self, tenant: str, report: MemorizeReport) -> None:
        """The tenant's LLM fallbacks, for /v1/stats (Prometheus has them per replica, not per tenant)."""
        summary = report.compaction.summary if report.compaction is not None else None
        try:
            await self.stores.log.count(
                tenant,
                {
                    "summary_fallbacks": int(summary is not None and summary.mode == "fallback"),
                    "extraction_failures": int(report.extraction_failed),
                },
            )
        except Exception as exc:  # a figure, never a reason to fail the pass
            logger.warning("could not count LLM trouble of %s: %r", tenant, exc)

    async def sweep(self) -> None:
        """One pass: start the sessions of both lanes that are due, flush, repair after a Milvus restart."""
        pending = await self.stores.log.pending_since(limit=self.pending_limit)
        embedding_lane, llm_lane = await self.stores.log.lane_sizes()
        self.observers.pending(embedding_lane)
        self.observers.llm_pending(llm_lane)
        self.backlog = Backlog(embedding_lane, max(0.0, time.time() - pending[0][2] / 1000) if pending else 0.0)
        now = time.monotonic()
        for tenant, session, _ in pending:
            key = (tenant, session)
            if key not in self.running and self.not_before.get(key, (0.0, 0.0))[0] <= now:
                self.schedule(tenant, session)
        if self.logic.uses_llm:
            due = await self.stores.log.llm_due(limit=self.pending_limit)
            for tenant, session in due:
                if (tenant, session) not in self.llm_running:
                    self.schedule_llm(tenant, session)
        await self._flush_if_due(now)
        await self._repair_if_reloaded()
        if self.reindex is None:
            self.reindex = asyncio.create_task(self._reindex())

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.memorizer_sweep_interval_s)
            try:
                await self.sweep()
            except Exception:
                logger.exception("memorizer sweep failed; retrying next interval")

    async def _repair_if_reloaded(self) -> None:
        """After Milvus restarted (a replica found the collection released), re-embed what it lost."""
        if not self.settings.vector_repair or (self.repair is not None and not self.repair.done()):
            return
        reloads = await self.stores.milvus_reloads()
        if reloads != self.repaired_reloads:
            self.repair = asyncio.create_task(self._repair(reloads))

    async def _repair(self, reloads: int) -> None:
        try:
            repaired = await repair_vectors(self.stores, self.embed)
            self.observers.repaired(repaired.written)
            self.observers.unstorable(repaired.unstorable)
            self.repaired_reloads = reloads
            self.unflushed = self.unflushed or repaired.written > 0
        except Exception:
            logger.exception("vector repair failed; the next sweep retries")

    async def _reindex(self) -> None:
        """Memories written under an older keyword analysis, Milvus key scheme or document embedding,
        brought to this code's (the move first: it copies what it can, where a new embedding
        cannot)."""
        try:
            self.observers.reindexed(await reindex_keywords(self.stores, self.settings))
            moved = await move_vectors(self.stores, self.embed)
            self.observers.moved(moved.written)
            self.observers.unstorable(moved.unstorable)
            self.unflushed = self.unflushed or moved.written > 0
            reembedded = await reembed_vectors(self.stores, self.embed)
            self.observers.reembedded(reembedded.written)
            self.observers.unstorable(reembedded.unstorable)
            self.unflushed = self.unflushed or reembedded.written > 0
        except Exception:
            logger.exception("re-indexing older memories failed; the next sweep goes on from where it stopped")
            self.reindex = None

    async def _flush_if_due(self, now: float) -> None:
        interval = self.settings.milvus_flush_interval_s
        elapsed = now - self.last_flush
        # Also now and then when idle: memories added directly by the ingress need sealing too.
        if interval and ((self.unflushed and elapsed >= interval) or elapsed >= 15 * interval):
            self.unflushed = False
            self.last_flush = now
            await self.stores.vectors.flush()
