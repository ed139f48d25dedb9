"""An embedded server as a child process: spawned in its own process group with its output in a
log, waited for until it answers, stopped or killed with everything it started."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from serve_app.embedded.ports import port_open


class LaunchError(RuntimeError):
    pass


@dataclass
class Backend:
    """A running server: its process (the leader of its process group), the URL clients use, its log."""

    name: str
    process: subprocess.Popen
    url: str
    log_path: Path
    stop_signal: int = signal.SIGTERM
    stop_timeout_s: float = 20.0

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float | None = None) -> None:
        if not self.alive():
            return
        self.process.send_signal(self.stop_signal)
        try:
            self.process.wait(self.stop_timeout_s if timeout_s is None else timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)

    def kill(self) -> None:
        """Crash it (SIGKILL to its whole process group), as a fault test would."""
        if self.alive():
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


def wait_until_up(check: Callable[[], bool], backend: Backend, timeout_s: float) -> None:
    """Poll `check` until it passes; a server that exits or does not come up in time is stopped and
    reported, with the end of its log."""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if not backend.alive():
                raise LaunchError(f"{backend.name} exited: see {backend.log_path}\n{_tail(backend.log_path)}")
            if check():
                return
            time.sleep(0.1)
    except BaseException:  # a probe that raised, or Ctrl-C: never leave the server running unowned
        backend.kill()
        raise
    backend.stop()
    raise LaunchError(f"{backend.name} did not come up in {timeout_s:.0f}s: see {backend.log_path}")


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def spawn(name: str, argv: list[str], log_path: Path, **kwargs) -> subprocess.Popen:
    """Start a server in a process group of its own (so stopping it stops what it started), its
    output appended to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:  # the child gets a descriptor of its own; the launcher's is closed here
        return subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, **kwargs
        )


def ensure_port_free(port: int, name: str) -> None:
    if port_open(port):
        raise LaunchError(f"port {port} for {name} is already in use (another memserve up? try memserve down)")
