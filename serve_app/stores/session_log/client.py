"""`SessionLog`: the session log's parts, each a module of its own, composed into one client."""

from __future__ import annotations

from serve_app.runtime.tracing import traced_store
from serve_app.stores.session_log.checkpoint import Checkpoints
from serve_app.stores.session_log.cursors import Cursors
from serve_app.stores.session_log.lanes import Lanes
from serve_app.stores.session_log.layout import LayoutMigration
from serve_app.stores.session_log.leases import Leases
from serve_app.stores.session_log.stats import Stats
from serve_app.stores.session_log.turns import SessionTurns
from serve_app.stores.session_log.users import UserSessions


@traced_store("redis")
class SessionLog(SessionTurns, Checkpoints, Cursors, Lanes, Leases, UserSessions, Stats, LayoutMigration):
    """Async Redis client for session logs, checkpoints, cursors and the two lanes.
    `cluster`: the URL names one node of a Redis Cluster (redis-py has no URL scheme for it);
    `sentinel_master`: the URL names the Sentinels watching that primary.

    Durability: a write whose loss would move a session backwards is acknowledged only once
    `confirm_replicas` replicas confirmed it (within `confirm_timeout_ms`, else `ReplicasUnconfirmed`,
    a 503): appends, checkpoints, cursors, session deletes and tombstones. Leases, lane back-off and
    counters are not: losing one repeats idempotent work. Call `start` first."""
