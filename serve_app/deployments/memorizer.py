"""Memorizer deployment: embeds, extracts and compacts after each session's cursors, off the request
path (`services/sweep.py` decides what and when).
"""

from __future__ import annotations

import asyncio

from ray import serve
from ray.serve.handle import DeploymentHandle
from ray.util import metrics

from serve_app.deploy.autoscaling import LAG, WAITING
from serve_app.deployments.redis_metrics import RedisConfirmMetrics, sample_replica_lag
from serve_app.errors import ServiceError
from serve_app.llm.client import llm_client
from serve_app.runtime import tracing
from serve_app.runtime.priority import lower_priority
from serve_app.services.compaction import CompactionOutcome, Redo
from serve_app.services.memorizer import MemorizeReport
from serve_app.services.sweep import MemorizerSweep
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores


def _add(counter: metrics.Counter, value: float) -> None:
    """Ray counters refuse increments of zero."""
    if value > 0:
        counter.inc(value)


class _Metrics:
    """Prometheus metrics of the memorizer (the sweep's observers; Ray adds the `ray_` prefix)."""

    def __init__(self) -> None:
        self.processed = metrics.Counter("memserve_memorizer_sessions_processed", "Sessions brought up to date.")
        self.failures = metrics.Counter("memserve_memorizer_failures", "Memorization passes that failed (retried).")
        self.conflicts = metrics.Counter("memserve_checkpoint_cas_conflicts", "Checkpoint compare-and-set conflicts.")
        self.pending_sessions = metrics.Gauge("memserve_memorizer_pending_sessions", "Sessions with turns not yet embedded.")
        self.llm_pending_sessions = metrics.Gauge(
            "memserve_memorizer_llm_pending_sessions", "Sessions owed LLM work (extraction, summaries), due or backing off."
        )
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
        self.keywords_reindexed = metrics.Counter(
            "memserve_keywords_reindexed", "Memories whose keywords were indexed again under a newer analysis."
        )
        self.vectors_reembedded = metrics.Counter(
            "memserve_vectors_reembedded", "Memories embedded again under a newer document embedding."
        )
        self.vectors_repaired = metrics.Counter(
            "memserve_vectors_repaired", "Vectors re-embedded from PostgreSQL after a Milvus restart had lost them."
        )
        self.vectors_moved = metrics.Counter(
            "memserve_vectors_moved", "Memories whose vectors were moved from an older Milvus key scheme to this one."
        )
        self.vectors_unstorable = metrics.Counter(
            "memserve_vectors_unstorable",
            "Memories PostgreSQL holds that a repair, move or re-embedding skipped: no Milvus row can hold them.",
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

    def compacted(self, outcome: CompactionOutcome | None) -> None:
        if outcome is None or not outcome.compacted or outcome.summary is None:
            return
        self.summaries.inc(tags={"mode": outcome.summary.mode})
        _add(self.fallbacks, int(outcome.summary.mode == "fallback"))
        _add(self.tokens_before, outcome.tokens_before)
        _add(self.tokens_after, outcome.tokens_after)
        if outcome.tokens_before > 0:
            self.ratio.observe(outcome.tokens_after / outcome.tokens_before)
        _add(self.pinned, len(outcome.summary.pinned))

    def memorized(self, report: MemorizeReport, lag_s: float | None) -> None:
        self.processed.inc()
        if lag_s is not None:
            self.lag.observe(lag_s)
        _add(self.embedded, report.embedded)
        self.compacted(report.compaction)
        _add(self.facts, report.facts_written)
        _add(self.rejects, report.extraction_rejects)
        _add(self.extraction_failures, int(report.extraction_failed))
        _add(self.redone, int(report.redone is Redo.REDONE))

    def conflict(self) -> None:
        self.conflicts.inc()

    def pending(self, count: int) -> None:
        self.pending_sessions.set(count)

    def llm_pending(self, count: int) -> None:
        self.llm_pending_sessions.set(count)

    def failed(self) -> None:
        self.failures.inc()

    def repaired(self, count: int) -> None:
        _add(self.vectors_repaired, count)

    def reindexed(self, count: int) -> None:
        _add(self.keywords_reindexed, count)

    def reembedded(self, count: int) -> None:
        _add(self.vectors_reembedded, count)

    def moved(self, count: int) -> None:
        _add(self.vectors_moved, count)

    def unstorable(self, count: int) -> None:
        _add(self.vectors_unstorable, count)


@serve.deployment(name="Memorizer", max_ongoing_requests=64, ray_actor_options={"num_cpus": 0.25})
class Memorizer:
    """A thin shell: the replica's stores, LLM client, Embedder handle and metrics around one
    `MemorizerSweep`, which runs on a timer in the replica's event loop."""

    async def __init__(self, embedder: DeploymentHandle, settings: dict | None = None):
        self.settings = Settings(**(settings or {}))
        tracing.configure(self.settings, "Memorizer")
        lower_priority(self.settings.background_nice)
        self.embedder = embedder
        self.stores = await Stores.connect(self.settings, redis_observer=RedisConfirmMetrics())
        self.work = MemorizerSweep(self.stores, self._embed, self.settings, llm_client(self.settings), observers=_Metrics())
        self.sweeper = asyncio.create_task(self.work.run_forever())
        self.lag_sampler = asyncio.create_task(sample_replica_lag(self.stores.log))

    async def _embed(self, texts: list[str], plain: list[bool] | None = None) -> list[list[float]]:
        return await self.embedder.embed_many.remote(texts, plain, tracing.carrier())

    async def poke(self, tenant: str, session: str, trace: tracing.Carrier | None = None) -> None:
        """Start work for a session and return at once; the pass links to the caller's trace."""
        with tracing.span("Memorizer.poke", kind="server", parent=trace):
            self.work.schedule(tenant, session)

    async def compress(self, tenant: str, session: str, trace: tracing.Carrier | None = None) -> dict | ServiceError:
        """Compact now (the API's /compress), with the configured summarizer. A refusal (the session
        gone, every compare-and-set race lost) is returned for the Ingress to answer with: raised
        here, Serve would log it as a failed request, traceback and all, and count it in this
        deployment's errors, and a 404 or a 409 to retry is neither."""
        with tracing.span("Memorizer.compress", kind="server", parent=trace):
            try:
                return await self.work.compress(tenant, session)
            except ServiceError as refused:
                return refused

    def record_autoscaling_stats(self) -> dict[str, float]:
        """What `serve_app.deploy.autoscaling:MemorizerBacklogPolicy` scales on (the last sweep's view)."""
        backlog = self.work.backlog
        return {WAITING: float(backlog.waiting_sessions), LAG: backlog.lag_s}

    async def check_health(self) -> None:
        if self.sweeper.done():
            raise RuntimeError("memorizer sweep loop stopped")

    async def __del__(self):
        if hasattr(self, "sweeper"):
            self.sweeper.cancel()
            self.lag_sampler.cancel()
            await self.stores.close()
