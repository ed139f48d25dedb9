"""Process liveness as `memserve down` and the launchers read it."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
import warnings

import psutil

from serve_app.embedded.backend import spawn
from serve_app.runtime.processes import marked_processes, pid_alive


def _exited_unreaped() -> subprocess.Popen:
    """A child that has exited and that nobody has reaped yet (a zombie): what `memserve down` meets
    when the process that started `up` has not waited on it."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # wait for the exit, leave it unreaped
    return child


def test_a_running_process_is_alive_and_a_reaped_one_is_not():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert pid_alive(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not pid_alive(child.pid)


def test_an_exited_process_nobody_reaped_is_not_alive():
    child = _exited_unreaped()
    try:
        assert not pid_alive(child.pid)
    finally:
        child.wait()


def test_no_pid_is_not_alive():
    assert not pid_alive(0)
    assert not pid_alive(-1)


def test_a_spawned_server_keeps_its_log_open_and_the_launcher_closes_its_copy(tmp_path):
    """`memserve up` restarts a store that exits: the launcher closes its copy of the log's
    descriptor itself rather than leaving it to the collector (a ResourceWarning each start)."""
    log = tmp_path / "logs" / "server.log"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        child = spawn("server", [sys.executable, "-c", "import time; time.sleep(30)"], log)
        gc.collect()
    try:
        assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
        assert str(log) not in [f.path for f in psutil.Process().open_files()]
        assert str(log) in [f.path for f in psutil.Process(child.pid).open_files()]
    finally:
        child.kill()
        child.wait()


def test_a_marker_in_the_environment_finds_the_process_tree_it_was_set_in_and_not_this_one():
    marker = f"mark-{os.getpid()}"
    env = {**os.environ, "MEMSERVE_TEST_MARKER": marker}
    grandchild = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import time; time.sleep(30)'])"
    child = subprocess.Popen([sys.executable, "-c", grandchild], env=env)
    try:
        deadline = time.monotonic() + 20
        while len(found := marked_processes("MEMSERVE_TEST_MARKER", marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child.pid in {p.pid for p in found} and len(found) == 2  # the child and what it started
        assert marked_processes("MEMSERVE_TEST_MARKER", "another") == []
    finally:
        for proc in psutil.Process(child.pid).children(recursive=True):
            proc.kill()
        child.kill()
        child.wait()
