"""Memorizer deployment: embeds, extracts and compacts after each session's cursors, off the request path.

A timer in each replica sweeps Redis's pending set (appends may also poke it through its handle,
`memorizer_poke`), so a lost poke or a crashed replica only delays work, and the next sweep redoes
it from the cursors.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ray import serve
from ray.serve.handle import DeploymentHandle
from ray.util import metrics

from serve_app.llm.client import ChatClient, OpenAIChatClient, ServeLLMClient
from serve_app.runtime.priority import lower_priority
from serve_app.services.compaction import CompactionOutcome
from serve_app.services.memories import repair_vectors
from serve_app.services.memorizer import MemorizeReport, SessionMemorizer
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores

logger = logging.getLogger("ray.serve")
MAX_BACKOFF_S = 60.0


def make_llm_client(settings: Settings, llm: DeploymentHandle | None) -> ChatClient | None:
    if settings.llm_mode == "openai":
        return OpenAIChatClient(settings.llm_base_url, settings.llm_model, settings.llm_api_key, settings.llm_timeout_s)
    if settings.llm_mode == "ray-serve-llm":
        if llm is None:
            raise ValueError("llm_mode ray-serve-llm needs the LLM deployment bound into the app")
        return ServeLLMClient(llm, settings.llm_model, settings.llm_timeout_s)
    return None


def _add(counter: metrics.Counter, value: float) -> None:
    """Ray counters refuse increments of zero."""
    if value > 0:
        counter.inc(value)


class _Metrics:
    def __init__(self) -> None:
        self.processed = metrics.Counter("memserve_memorizer_sessions_processed", "Sessions brought up to date.")
        self.failures = metrics.Counter("memserve_memorizer_failures", "Memorization passes that failed (retried).")
        self.conflicts = metrics.Counter("memserve_checkpoint_cas_conflicts", "Checkpoint compare-and-set conflicts.")
        self.pending = metrics.Gauge("memserve_memorizer_pending_sessions", "Sessions waiting for memorization.")
        self.embedded = metrics.Counter("memserve_memorizer_turns_embedded", "Turns written to the vector store.")
        self.summaries = metrics.Counter("memserve_summary_calls", "Summaries made, by mode.", tag_keys=("mode",))
        self.fallbacks = metrics.Counter("memserve_summary_fallbacks", "LLM summaries that fell back to extractive.")
        self.tokens_before = metrics.Counter("memserve_compaction_tokens_before", "History tokens before compaction.")
        self.tokens_after = metrics.Counter("memserve_compaction_tokens_after", "History tokens after compaction.")
        self.pinned = metrics.Counter("memserve_summary_pinned_items", "Key items the LLM dropped and we pinned.")
        self.facts = metrics.Counter("memserve_extraction_facts_written", "Facts written by extraction.")
        self.rejects = metrics.Counter("memserve_extraction_rejects", "Extracted facts rejected by validation.")
        self.extraction_failures = metrics.Counter("memserve_extraction_failures", "Extraction calls that failed.")
        self.redone = metrics.Counter("memserve_summary_redone", "Degraded checkpoints rebuilt by the LLM.")
        self.repaired = metrics.Counter(
            "memserve_vectors_repaired", "Vectors re-embedded from PostgreSQL after a Milvus restart had lost them."
        )
        self.lag = metrics.Histogram(
            "memserve_memorization_lag_seconds",
            "From a session's oldest unmemorized turn to the end of the pass that memorized it.",
            boundaries=[0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300],
        )
        self.ratio = metrics.Histogram(
            "memserve_compression_ratio",
            "History tokens after compaction / before, per compaction.",
            boundaries=[0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0],
        )

    def compaction(self, outcome: CompactionOutcome | None) -> None:
        if outcome is None or not outcome.compacted or outcome.summary is None:
            return
        self.summaries.inc(tags={"mode": outcome.summary.mode})
        _add(self.fallbacks, int(outcome.summary.mode == "fallback"))
        _add(self.tokens_before, outcome.tokens_before)
        _add(self.tokens_after, outcome.tokens_after)
        if outcome.tokens_before > 0:
            self.ratio.observe(outcome.tokens_after / outcome.tokens_before)
        _add(self.pinned, len(outcome.summary.pinned))

    def report(self, report: MemorizeReport) -> None:
        self.processed.inc()
        _add(self.embedded, report.embedded)
        self.compaction(report.compaction)
        _add(self.facts, report.facts_written)
        _add(self.rejects, report.extraction_rejects)
        _add(self.extraction_failures, int(report.extraction_failed))
        _add(self.redone, int(bool(report.redone)))


@serve.deployment(name="Memorizer", max_ongoing_requests=64, ray_actor_options={"num_cpus": 0.25})
class Memorizer:
    async def __init__(self, embedder: DeploymentHandle, settings: dict | None = None, llm: DeploymentHandle | None = None):
        self.settings = Settings(**(settings or {}))
        lower_priority(self.settings.background_nice)
        self.embedder = embedder
        self.stores = await Stores.connect(self.settings)
        self.llm = make_llm_client(self.settings, llm)
        self.logic = SessionMemorizer(self.stores, self._embed, self.settings, self.llm)
        self.running: dict[tuple[str, str], asyncio.Task] = {}
        self.again: set[tuple[str, str]] = set()
        self.not_before: dict[tuple[str, str], tuple[float, float]] = {}  # retry backoff per session
        self.metrics = _Metrics()
        self.unflushed = False
        self.last_flush = time.monotonic()
        self.repaired_reloads: int | None = None  # None: repair once at start (Milvus may have restarted meanwhile)
        self.repair: asyncio.Task | None = None
        self.sweeper = asyncio.create_task(self._sweep_forever())

    async def _embed(self, texts: list[str]) -> list[list[float]]:
        return await self.embedder.embed_many.remote(texts)

    def _schedule(self, tenant: str, session: str) -> asyncio.Task:
        key = (tenant, session)
        task = self.running.get(key)
        if task is not None and not task.done():
            self.again.add(key)  # new turns arrived while running: run once more afterwards
            return task
        task = asyncio.create_task(self._run(key))
        self.running[key] = task
        return task

    async def _run(self, key: tuple[str, str]) -> MemorizeReport | None:
        report = None
        try:
            while True:
                self.again.discard(key)
                since_ms = await self.stores.log.pending_since_ms(*key)
                report = await self.logic.memorize(*key, on_conflict=self.metrics.conflicts.inc)
                self.metrics.report(report)
                if since_ms is not None and report.cursor >= 0:
                    self.metrics.lag.observe(max(0.0, time.time() - since_ms / 1000))
                self.unflushed = self.unflushed or report.embedded > 0
                if key not in self.again:
                    break
            llm_trouble = report.extraction_failed or (report.compaction and report.compaction.degraded) or report.redone is False
            if llm_trouble:
                self._back_off(key)
            else:
                self.not_before.pop(key, None)
        except Exception:
            self.metrics.failures.inc()
            self._back_off(key)
            logger.exception("memorization of %s/%s failed; the sweep will retry from the cursor", *key)
        finally:
            self.running.pop(key, None)
        return report

    def _back_off(self, key: tuple[str, str]) -> None:
        _, delay = self.not_before.get(key, (0.0, self.settings.memorizer_sweep_interval_s))
        delay = min(MAX_BACKOFF_S, delay * 2)
        self.not_before[key] = (time.monotonic() + delay, delay)

    async def poke(self, tenant: str, session: str) -> None:
        """Start work for a session and return at once."""
        self._schedule(tenant, session)

    async def compress(self, tenant: str, session: str) -> dict:
        """Compact now (the API's /compress), with the configured summarizer."""
        outcome = await self.logic.compact(tenant, session, force=True, on_conflict=self.metrics.conflicts.inc)
        self.metrics.compaction(outcome)
        return outcome.public()

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.memorizer_sweep_interval_s)
            try:
                pending = await self.stores.log.pending(limit=256)
                self.metrics.pending.set(len(pending))
                now = time.monotonic()
                for tenant, session in pending:
                    key = (tenant, session)
                    if key not in self.running and self.not_before.get(key, (0.0, 0.0))[0] <= now:
                        self._schedule(tenant, session)
                await self._flush_if_due(now)
                await self._repair_if_reloaded()
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
            repaired = await repair_vectors(self.stores, self._embed)
            _add(self.metrics.repaired, repaired)
            self.repaired_reloads = reloads
            self.unflushed = self.unflushed or repaired > 0
        except Exception:
            logger.exception("vector repair failed; the next sweep retries")

    async def _flush_if_due(self, now: float) -> None:
        interval = self.settings.milvus_flush_interval_s
        elapsed = now - self.last_flush
        # Also now and then when idle: memories added directly by the ingress need sealing too.
        if interval and ((self.unflushed and elapsed >= interval) or elapsed >= 15 * interval):
            self.unflushed = False
            self.last_flush = now
            await self.stores.vectors.flush()

    async def check_health(self) -> None:
        if self.sweeper.done():
            raise RuntimeError("memorizer sweep loop stopped")

    async def __del__(self):
        if hasattr(self, "sweeper"):
            self.sweeper.cancel()
            await self.stores.close()
