"""Memorizer deployment: embeds turns after each session's cursor and compacts, off the request path.

A write pokes it through its handle; a timer in each replica also sweeps Redis's pending set, so a
lost poke or a crashed replica only delays work, and the next sweep redoes it from the cursor.
"""

from __future__ import annotations

import asyncio
import logging

from ray import serve
from ray.serve.handle import DeploymentHandle
from ray.util import metrics

from serve_app.services.memorizer import SessionMemorizer
from serve_app.services.stores import Stores
from serve_app.settings import Settings

logger = logging.getLogger("ray.serve")


@serve.deployment(name="Memorizer", max_ongoing_requests=64, ray_actor_options={"num_cpus": 0.25})
class Memorizer:
    async def __init__(self, embedder: DeploymentHandle, settings: dict | None = None):
        self.settings = Settings(**(settings or {}))
        self.embedder = embedder
        self.stores = await Stores.connect(self.settings)
        self.logic = SessionMemorizer(self.stores.log, self.stores.vectors, self._embed, self.settings)
        self.running: dict[tuple[str, str], asyncio.Task] = {}
        self.again: set[tuple[str, str]] = set()
        self.processed = metrics.Counter("memserve_memorizer_sessions_processed", "Sessions brought up to date.")
        self.failures = metrics.Counter(
            "memserve_memorizer_failures", "Memorization attempts that failed (retried by the sweep)."
        )
        self.conflicts = metrics.Counter("memserve_checkpoint_cas_conflicts", "Summary checkpoint compare-and-set conflicts.")
        self.pending_gauge = metrics.Gauge("memserve_memorizer_pending_sessions", "Sessions waiting for memorization.")
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

    async def _run(self, key: tuple[str, str]) -> int:
        cursor = -1
        try:
            while True:
                self.again.discard(key)
                cursor = await self.logic.memorize(*key, on_conflict=lambda: self.conflicts.inc())
                if key not in self.again:
                    break
            self.processed.inc()
        except Exception:
            self.failures.inc()
            logger.exception("memorization of %s/%s failed; the sweep will retry from the cursor", *key)
        finally:
            self.running.pop(key, None)
        return cursor

    async def poke(self, tenant: str, session: str) -> None:
        """Start work for a session and return at once."""
        self._schedule(tenant, session)

    async def memorize_now(self, tenant: str, session: str) -> int:
        """Bring a session up to date and return its cursor (tests, admin tools)."""
        return await asyncio.shield(self._schedule(tenant, session))

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.memorizer_sweep_interval_s)
            try:
                pending = await self.stores.log.pending(limit=256)
                self.pending_gauge.set(len(pending))
                for tenant, session in pending:
                    if (tenant, session) not in self.running:
                        self._schedule(tenant, session)
            except Exception:
                logger.exception("memorizer sweep failed; retrying next interval")

    async def check_health(self) -> None:
        if self.sweeper.done():
            raise RuntimeError("memorizer sweep loop stopped")

    async def __del__(self):
        if hasattr(self, "sweeper"):
            self.sweeper.cancel()
            await self.stores.close()
