"""The benchmarks' CPU accounting counts a process of the service that starts during a window.

A pool that grows under load starts PostgreSQL backends mid-run: their CPU is the requests' CPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from bench.load import CLIENT, cpu_seconds
from serve_app.cli import DATA_DIR_MARKER

BURN = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\ntime.sleep(30)"


def test_a_process_started_during_the_window_is_counted(tmp_path):
    before = cpu_seconds(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", BURN], env={**os.environ, DATA_DIR_MARKER: str(tmp_path.resolve())})
    try:
        deadline = time.monotonic() + 20
        while sum(psutil.Process(child.pid).cpu_times()[:2]) < 0.4 and time.monotonic() < deadline:
            time.sleep(0.05)
        after = cpu_seconds(tmp_path)
    finally:
        child.kill()
        child.wait()
    service = {group: seconds - before.get(group, 0.0) for group, seconds in after.items() if group != CLIENT}
    assert sum(service.values()) >= 0.35, service


def test_a_process_that_ends_while_it_is_read_is_left_out(tmp_path, monkeypatch):
    """The list of the service's processes is taken before each is read: one that exits between
    the two (a Ray worker, a PostgreSQL backend) has no CPU left to count, and no error to raise."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    listed = psutil.Process(child.pid)
    child.wait()
    monkeypatch.setattr("bench.load.service_processes", lambda _data_dir: [listed])
    assert set(cpu_seconds(tmp_path)) == {CLIENT}
