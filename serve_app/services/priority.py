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
    """Set every thread of this process to `niceness` (0 = leave as is); returns how many were set."""
    if niceness <= 0 or not os.path.isdir("/proc/self/task"):
        return 0
    changed = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), niceness)
            changed += 1
        except OSError:  # a thread that just ended, or a lower value than allowed
            continue
    logger.info("background process: %d threads at niceness %d", changed, niceness)
    return changed
