"""The benchmarks' CPU accounting counts a process of the service that starts during a window.

A pool that grows under load starts PostgreSQL backends mid-run: their CPU is the requests' CPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from bench.load import CLIENT, cpu_seconds
from serve_app.cli import DATA_DIR_MARKER

BURN = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\ntime.sleep(30)"


@contextmanager
def burning(*args: str, marked: Path | None = None) -> Iterator[subprocess.Popen]:
    """A process running BURN (with `args` on its command line), of the service at `marked`'s data
    dir or of no one; killed after."""
    env = {**os.environ, DATA_DIR_MARKER: str(marked.resolve())} if marked else None
    process = subprocess.Popen([sys.executable, "-c", BURN, *args], env=env)
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def wait_burned(process: subprocess.Popen, timeout_s: float = 20) -> None:
    """Until the BURN process has used its 0.4 s of CPU (or the timeout passed)."""
    deadline = time.monotonic() + timeout_s
    while sum(psutil.Process(process.pid).cpu_times()[:2]) < 0.4 and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_process_started_during_the_window_is_counted(tmp_path):
    before = cpu_seconds(tmp_path)
    with burning(marked=tmp_path) as child:
        wait_burned(child)
        after = cpu_seconds(tmp_path)
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


def test_memserve_up_itself_is_counted_though_its_environment_lacks_the_marker(tmp_path):
    """`up` sets the data-dir marker after it started, so its /proc environ
    lacks it: its pid file finds it, and its memory and CPU count as its own."""
    from bench.memory import group_of, measure, service_processes
    from serve_app.cli import _run_dir

    with burning("-m", "serve_app.cli", "up", "--milvus-port", "1") as up:
        (_run_dir(tmp_path.resolve()) / "memserve.pid").write_text(str(up.pid))
        wait_burned(up)
        found = {proc.pid: proc for proc in service_processes(tmp_path)}
        assert group_of(found[up.pid]) == "memserve up"
        assert cpu_seconds(tmp_path)["memserve up"] >= 0.35
        assert measure(tmp_path)[0]["memserve up"] > 1
    other = subprocess.Popen(["sleep", "30"])  # a pid file that names a process that is no `up`
    try:
        (_run_dir(tmp_path.resolve()) / "memserve.pid").write_text(str(other.pid))
        assert other.pid not in {proc.pid for proc in service_processes(tmp_path)}
    finally:
        other.kill()
        other.wait()


def test_cpu_no_group_counted_shows_as_outside_against_the_machines_whole_cpu(tmp_path):
    """The cross-check: CPU spent in the window by a process that is not the service's (nor the
    client) is in the machine's figure and in what no group counted, never in a group."""
    from bench.load import cpu_mark, cpu_per_request

    before = cpu_mark(tmp_path)
    started = time.monotonic()
    with burning() as stranger:  # no marker: not the service's
        wait_burned(stranger)
        after = cpu_mark(tmp_path)
    figures = cpu_per_request(before, after, 1, time.monotonic() - started)
    assert set(figures["ms_per_request"]) <= {CLIENT}
    assert figures["outside_ms_per_request"] >= 350, figures


def test_bench_scale_waits_until_the_service_is_idle_before_it_measures(tmp_path):
    """Work a load leaves behind (a store compacting) is not counted in the first window's requests."""
    from bench.scale import wait_idle

    with burning(marked=tmp_path) as busy:
        waited, rate = wait_idle(tmp_path, bound_ms_per_s=300, max_s=30, window_s=0.5)
        assert sum(psutil.Process(busy.pid).cpu_times()[:2]) >= 0.35  # it waited out the burn
        assert rate < 300 and waited >= 0.5
    assert wait_idle(None, 300, 30)[0] == 0.0
