"""Background work gives way to requests on a shared CPU.

The memorizer and the embedder (when queries are embedded in the ingress) do work no caller waits
for: on two cores they otherwise take CPU from the proxy and the ingress that answer requests
(bench/load.py: append throughput at concurrency 32). Linux keeps niceness per thread, so every
thread of the process is lowered; threads started later inherit it from their creator.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("ray.serve")


def lower_priority(niceness: int) -> int:
    """Lower every thread of this process by `niceness` steps (0 = leave as is, 19 at most);
    returns how many were set.

    Relative, not absolute: Ray starts workers at its `worker_niceness` (15 unless the environment
    says otherwise), and an absolute 10 would have raised the background above the requests."""
    if niceness <= 0 or not os.path.isdir("/proc/self/task"):
        return 0
    changed = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            target = min(19, os.getpriority(os.PRIO_PROCESS, int(tid)) + niceness)
            os.setpriority(os.PRIO_PROCESS, int(tid), target)
            changed += 1
        except OSError:  # a thread that just ended, or a lower value than allowed
            continue
    now = os.getpriority(os.PRIO_PROCESS, 0)
    logger.info("background process: %d threads lowered by %d to niceness %d", changed, niceness, now)
    return changed
