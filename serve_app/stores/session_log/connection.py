"""The connection every part of the session log works through: one Redis client (single, Sentinel
or cluster), the sessions' time to live, and the writes that replicas must confirm."""

from __future__ import annotations

import logging

from serve_app.stores.confirmed_writes import ConfirmedWrites, ConfirmObserver
from serve_app.stores.redis_client import AnyRedis, connect
from serve_app.stores.session_log.keys import SessionKeys

logger = logging.getLogger("ray.serve")


class SessionLogConnection(SessionKeys):
    """`cluster`: the URL names one node of a Redis Cluster (redis-py has no URL scheme for it);
    `sentinel_master`: the URL names the Sentinels watching that primary. Each part's Lua scripts
    are registered with this client on first use. Call `start` first."""

    def __init__(
        self,
        url: str,
        ttl_s: int,
        *,
        cluster: bool = False,
        sentinel_master: str = "",
        confirm_replicas: int = 0,
        confirm_timeout_ms: int = 1000,
        observer: ConfirmObserver | None = None,
    ):
        self.cluster = cluster
        self.redis: AnyRedis = connect(url, cluster=cluster, sentinel_master=sentinel_master)
        self.ttl_s = ttl_s
        self.writes = ConfirmedWrites(self.redis, confirm_replicas, confirm_timeout_ms, observer)

    async def start(self) -> None:
        """Check the replica setting against the primaries (refusing one they cannot meet) and log
        which confirmation runs."""
        logger.info("session log: %s", await self.writes.start())

    async def replica_lag(self) -> dict[str, int]:
        """Each primary's furthest-behind replica, in bytes (also sent to the observer)."""
        return await self.writes.replica_lag()

    async def close(self) -> None:
        await self.redis.aclose()

    async def ping(self) -> bool:
        return bool(await self.redis.ping())
