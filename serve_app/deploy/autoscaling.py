"""Custom Serve autoscaling policies (Ray 2.60 custom policies fed by recorded autoscaling stats).

Named in the Serve configs as `serve_app.deploy.autoscaling:MemorizerBacklogPolicy`, with its
`policy_kwargs`; each Memorizer replica reports `waiting_sessions` and `lag_s` from its last sweep
(`serve_app/deployments/memorizer.py`, `record_autoscaling_stats`).
"""

from __future__ import annotations

from typing import Any

from serve_app.core.memorizer_scaling import BacklogTarget, desired_memorizers

WAITING = "waiting_sessions"
LAG = "lag_s"


def _worst(metrics: Any, name: str) -> float:
    """The replicas read the same shared lanes, so the freshest view is the largest one."""
    per_replica = (metrics or {}).get(name) or {}
    return max((float(v) for v in per_replica.values()), default=0.0)


class MemorizerBacklogPolicy:
    """Scales the Memorizer on the embedding lane's backlog and memorization lag."""

    def __init__(self, sessions_per_replica: float = 32.0, target_lag_s: float = 5.0):
        self.target = BacklogTarget(sessions_per_replica=sessions_per_replica, target_lag_s=target_lag_s)

    def __call__(self, ctx: Any) -> tuple[float, dict[str, Any]]:
        metrics = ctx.aggregated_metrics
        waiting, lag = _worst(metrics, WAITING), _worst(metrics, LAG)
        desired = desired_memorizers(waiting, lag, ctx.current_num_replicas, self.target)
        return desired, {"waiting_sessions": waiting, "lag_s": lag, "desired": desired}
