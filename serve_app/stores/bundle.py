"""The store clients one replica holds: opened once, pooled, closed on shutdown.

Services reach every store through this bundle and the stores' own methods, never through a
store's client.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from serve_app.settings import Settings
from serve_app.stores.audit import AuditLog
from serve_app.stores.chat_calls import ChatCalls
from serve_app.stores.confirmed_writes import ConfirmObserver
from serve_app.stores.facts import FactStore
from serve_app.stores.keyword_index import KeywordIndex
from serve_app.stores.pg_pool import session_lock
from serve_app.stores.rate_limit import RateLimiter
from serve_app.stores.session_log import SessionLog
from serve_app.stores.spaces import SpaceStore
from serve_app.stores.vectors import VectorStore

MILVUS_RELOADS_KEY = "ms:milvus:reloads"


@dataclass
class Stores:
    log: SessionLog
    facts: FactStore
    vectors: VectorStore
    keywords: KeywordIndex
    rate_limits: RateLimiter
    audit: AuditLog
    chats: ChatCalls
    spaces: SpaceStore

    @classmethod
    async def connect(cls, settings: Settings, redis_observer: ConfirmObserver | None = None) -> Stores:
        log = SessionLog(
            settings.redis_url,
            settings.session_ttl_s,
            cluster=settings.redis_cluster,
            sentinel_master=settings.redis_sentinel_master,
            confirm_replicas=settings.redis_confirm_replicas,
            confirm_timeout_ms=settings.redis_confirm_timeout_ms,
            observer=redis_observer,
        )
        await log.start()
        await log.migrate_layout()
        facts = await FactStore.connect(settings.postgres_dsn)
        # Replicas starting together would race to create the collection and its partitions (one
        # could read a half-made partition list): a PostgreSQL advisory lock lets one make it whole.
        async with session_lock(facts.pool, f"memserve milvus collection\x1f{settings.milvus_collection}"):
            vectors = await asyncio.to_thread(
                VectorStore,
                settings.milvus_uri,
                settings.milvus_collection,
                settings.embedding_dim,
                settings.milvus_token,
                settings.milvus_partitions,
            )
        # Every replica that finds the collection released (Milvus restarted) counts it in Redis: the
        # memorizer repairs the vectors a restarted Milvus Lite lost (services/index_repair.repair_vectors).
        vectors.on_reload = lambda: log.redis.incr(MILVUS_RELOADS_KEY)
        return cls(
            log=log,
            facts=facts,
            vectors=vectors,
            keywords=KeywordIndex(facts.pool),
            rate_limits=RateLimiter(log.redis),
            audit=AuditLog(facts.pool),
            chats=ChatCalls(log.redis, settings.chat_retry_window_s),
            spaces=SpaceStore(facts.pool),
        )

    async def milvus_reloads(self) -> int:
        return int(await self.log.redis.get(MILVUS_RELOADS_KEY) or 0)

    async def close(self) -> None:
        await asyncio.gather(self.log.close(), self.facts.close(), self.vectors.close(), return_exceptions=True)

    async def health(self) -> dict[str, str]:
        async def check(name: str, probe) -> tuple[str, str]:
            try:
                await asyncio.wait_for(probe(), timeout=2.0)
                return name, "ok"
            except Exception as exc:  # a health probe reports, it does not raise
                return name, f"unavailable: {type(exc).__name__}"

        results = await asyncio.gather(
            check("redis", self.log.ping), check("postgres", self.facts.ping), check("milvus", self.vectors.ping)
        )
        return dict(results)
