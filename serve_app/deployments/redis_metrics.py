"""Prometheus metrics of replica confirmation (Ray exports them with the `ray_` prefix), and the
loop that samples replica lag: a replica far behind is what a failover would lose unconfirmed, and
what makes confirmed writes time out."""

from __future__ import annotations

import asyncio
import logging

from ray.util import metrics

from serve_app.stores.session_log import SessionLog

logger = logging.getLogger("ray.serve")

LAG_SAMPLE_S = 10.0


class RedisConfirmMetrics:
    """A `ConfirmObserver` that counts confirmation timeouts and reports each primary's replica lag."""

    def __init__(self) -> None:
        self.timeouts = metrics.Counter(
            "memserve_redis_confirm_timeouts",
            "Session-log writes answered 503 because too few replicas confirmed them in time.",
            tag_keys=("command",),
        )
        self.lag = metrics.Gauge(
            "memserve_redis_replica_lag_bytes",
            "How far each Redis primary's furthest-behind replica trails it (replication stream bytes).",
            tag_keys=("primary",),
        )

    def confirm_timeout(self, command: str) -> None:
        self.timeouts.inc(tags={"command": command})

    def replica_lag(self, primary: str, lag_bytes: int) -> None:
        self.lag.set(lag_bytes, tags={"primary": primary})


async def sample_replica_lag(log: SessionLog, every_s: float = LAG_SAMPLE_S) -> None:
    """Report replica lag every `every_s` until cancelled; a failed sample waits for the next."""
    while True:
        try:
            await log.replica_lag()
        except Exception as exc:  # Redis moving or down: the request path reports that, not this loop
            logger.debug("replica lag sample failed: %r", exc)
        await asyncio.sleep(every_s)
