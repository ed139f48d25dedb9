"""Process liveness by pid, for `memserve up`/`down` and the embedded launchers."""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """True when a process with this pid runs (also one of another user). A process that exited and
    was not reaped yet (a zombie) holds nothing but its pid: waiting for it to go would wait for
    its parent, not for it, so it counts as gone."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _exited(pid)


def _exited(pid: int) -> bool:
    """Whether /proc says the process has exited (Z: zombie, X: dead); False where /proc is absent."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state follows the command name in parentheses, which may itself hold spaces or parentheses.
    state = stat.rpartition(")")[2].split()[:1]
    return state in (["Z"], ["X"])
