"""Process liveness by pid, for `memserve up`/`down` and the embedded launchers."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True when a process with this pid exists (also one of another user)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
