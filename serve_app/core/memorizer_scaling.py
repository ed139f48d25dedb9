"""How many memorizer replicas the backlog asks for: pure arithmetic, no Ray.

The memorizer takes no requests worth counting (its work arrives through the lanes, not through
calls), so Serve's default policy, which follows ongoing requests, would never add a replica.
This follows the work instead: the sessions waiting in the embedding lane and the age of the
oldest of them (memorization lag). Ray's wrapper applies min and max replicas and the up- and
downscale delays to what this returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class BacklogTarget:
    sessions_per_replica: float = 32.0
    """Waiting sessions one replica is expected to clear within a sweep or two."""
    target_lag_s: float = 5.0
    """Lag above which the replicas are too few whatever the count says."""


def desired_memorizers(waiting_sessions: float, lag_s: float, current: int, target: BacklogTarget) -> float:
    """By count: enough replicas for the waiting sessions. By lag: when the oldest waiting turn is
    older than the target, the current replicas scaled by how far over it is (at least one more).
    The larger of the two; zero work asks for zero (the minimum replicas keep one running)."""
    by_count = math.ceil(max(0.0, waiting_sessions) / target.sessions_per_replica)
    by_lag = 0.0
    if lag_s > target.target_lag_s and waiting_sessions > 0:
        by_lag = max(current + 1, current * lag_s / target.target_lag_s)
    return float(max(by_count, by_lag))
