"""Processes by pid and by a marker in their environment, for `memserve up`/`down`, the embedded
launchers, and the benches and tests that look for what a service left running."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil


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


def marked_processes(variable: str, value: str) -> list[psutil.Process]:
    """The running processes (not this one) whose environment sets `variable` to `value`: a child
    inherits its parent's environment, so a variable set where a process tree starts finds all of
    it, whatever became of the parents in between."""
    import psutil  # here: `memserve`'s commands that never look for processes start without it

    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(variable) == value:
                found.append(proc)
        except (psutil.Error, OSError):  # ended meanwhile, or not ours to read
            continue
    return found
