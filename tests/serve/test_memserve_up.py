"""`memserve up` as a user runs it: start, write, stop, start again on the same data dir, `down`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from serve_app.cli import DATA_DIR_MARKER
from serve_app.embedded.ports import free_port
from serve_app.runtime.processes import marked_processes

from .conftest import wait_memorized


def _leftovers(data_dir: Path) -> list[int]:
    return [proc.pid for proc in marked_processes(DATA_DIR_MARKER, str(data_dir))]


class MemserveUp:
    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self.port = free_port()
        self.ports = [str(free_port()) for _ in range(3)]
        self.process: subprocess.Popen | None = None
        self.first_start_s = 0.0
        self.log = data_dir.parent / "memserve-up.log"

    def start(self, timeout_s: float = 180) -> float:
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "REDIS_URL", "POSTGRES_DSN", "MILVUS_URI")}
        argv = [
            sys.executable, "-m", "serve_app.cli", "up",
            "--data-dir", str(self.data_dir), "--port", str(self.port), "--metrics-port", "0",
            "--redis-port", self.ports[0], "--postgres-port", self.ports[1], "--milvus-port", self.ports[2],
        ]  # fmt: skip
        started = time.monotonic()
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        url = f"http://127.0.0.1:{self.port}/healthz"
        while time.monotonic() - started < timeout_s:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise AssertionError("memserve up did not become healthy:\n" + self.log.read_text()[-3000:])

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 90) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout_s)

    def down(self, timeout_s: float = 120) -> subprocess.CompletedProcess:
        """`memserve down`, with `up` reaped here as it exits, as the shell that started it would:
        `down` waits until the pid is gone, and an exited child nobody waited for keeps its pid."""
        argv = [sys.executable, "-m", "serve_app.cli", "down", "--data-dir", str(self.data_dir)]
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as down:
            if self.process is not None:
                try:
                    self.process.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    pass  # `down` kills it once its own wait is over
            stdout, stderr = down.communicate(timeout=timeout_s)
        return subprocess.CompletedProcess(argv, down.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def shared_up(tmp_path_factory) -> Iterator[MemserveUp]:
    """One data dir for the tests that need `up` running: they share its start (a minute or more)."""
    instance = MemserveUp(tmp_path_factory.mktemp("memserve-up") / "data")
    yield instance
    instance.down()


@pytest.fixture
def running_up(shared_up: MemserveUp) -> MemserveUp:
    """The shared instance, started if no test before left it running."""
    if not shared_up.running():
        shared_up.first_start_s = shared_up.start()
    return shared_up


@pytest.fixture
def up(tmp_path) -> Iterator[MemserveUp]:
    instance = MemserveUp(tmp_path / "data")
    yield instance
    instance.down()


def test_a_hangup_while_starting_leaves_nothing_behind(up):
    """SIGHUP (a closed terminal or ssh session) as SIGTERM: `up` stops Serve, the Ray node it
    started (which is not in its process group) and the stores, even in the middle of the deploy."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "REDIS_URL", "POSTGRES_DSN", "MILVUS_URI")}
    argv = [
        sys.executable, "-m", "serve_app.cli", "up", "--data-dir", str(up.data_dir), "--port", str(up.port),
        "--metrics-port", "0", "--redis-port", up.ports[0], "--postgres-port", up.ports[1], "--milvus-port", up.ports[2],
    ]  # fmt: skip
    with open(up.log, "ab") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    # Its own line: a traceback of a start that failed quotes the source line that prints it.
    deploying = re.compile(r"^deploying ", re.MULTILINE)
    deadline = time.monotonic() + 120
    while not deploying.search(up.log.read_text()) and time.monotonic() < deadline:
        assert process.poll() is None, up.log.read_text()[-3000:]
        time.sleep(0.1)  # signal it while Serve is still deploying
    before = up.log.read_text()
    assert deploying.search(before) and "ready in" not in before, "the signal must land while Serve deploys"
    process.send_signal(signal.SIGHUP)
    assert process.wait(90) == 0, up.log.read_text()[-3000:]
    after = up.log.read_text()
    assert "stopped" in after
    assert _leftovers(up.data_dir) == []


def test_a_backend_that_dies_is_started_again_and_keeps_its_data(running_up):
    """`memserve up` supervises its servers: Redis killed with SIGKILL (a crash, an OOM kill) is
    started again on its data dir, and the session acknowledged before the crash reads back."""
    up = running_up
    base = f"http://127.0.0.1:{up.port}"
    with httpx.Client(base_url=base, timeout=30) as client:
        turns = [{"role": "user", "content": "Ticket T-77 stays open until Friday."}]
        client.post("/v1/sessions/crash/messages", json={"user_id": "kim", "messages": turns}).raise_for_status()
        redis_pid = json.loads((up.data_dir / "run" / "backends.json").read_text())["redis"]["pid"]
        os.killpg(redis_pid, signal.SIGKILL)
        deadline, page = time.monotonic() + 60, None
        while time.monotonic() < deadline:
            try:
                response = client.get("/v1/sessions/crash/messages")
                if response.status_code == 200:
                    page = response.json()
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        assert page is not None, "Redis was not started again:\n" + up.log.read_text()[-3000:]
        assert [m["content"] for m in page["messages"]] == [t["content"] for t in turns]
        assert "redis exited" in up.log.read_text()
        # Redis answers before `up` has rewritten backends.json: its log line comes after the file.
        deadline = time.monotonic() + 30
        while "redis started again" not in up.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "redis started again" in up.log.read_text(), up.log.read_text()[-3000:]
        new_pid = json.loads((up.data_dir / "run" / "backends.json").read_text())["redis"]["pid"]
        assert new_pid != redis_pid


def test_up_holds_no_ray_driver_and_its_node_runs_no_monitors(running_up):
    """`memserve up` supervises a Ray node it started with `ray start` and deployed onto from a child
    that exited: it never imports Ray, Serve or pymilvus (with pandas and pyarrow, about 140 MiB it
    would hold for the service's life), and the node runs neither the autoscaler's monitor nor the
    log monitor."""
    up = running_up
    up_pid = int((up.data_dir / "run" / "memserve.pid").read_text())
    libraries = Path(f"/proc/{up_pid}/maps").read_text()
    for package in ("site-packages/ray/", "site-packages/pandas/", "site-packages/pyarrow/", "site-packages/torch/"):
        assert package not in libraries, f"memserve up loaded {package}"
    commands = []
    for proc in marked_processes(DATA_DIR_MARKER, str(up.data_dir)):
        try:
            commands.append(" ".join(proc.cmdline()))
        except psutil.Error:
            continue
    assert any("raylet" in c for c in commands) and any("ServeReplica:memserve:Ingress" in c for c in commands)
    assert not [c for c in commands if "autoscaler/_private/monitor.py" in c or "log_monitor.py" in c]


def _wait_remembered(client: httpx.Client, session: str, upto: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while client.get(f"/v1/sessions/{session}").json()["remembered_upto_seq"] < upto:
        assert time.monotonic() < deadline, "the summary memories did not catch up with the checkpoint"
        time.sleep(0.2)


def test_restart_on_same_data_dir_finds_everything(running_up):
    up = running_up
    base = f"http://127.0.0.1:{up.port}"
    with httpx.Client(base_url=base, timeout=60) as client:
        turns = [
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"note {i}: invoice INV-{i:04d} due 2025-0{i % 9 + 1}-15"}
            for i in range(40)
        ]
        client.post("/v1/sessions/persist/messages", json={"user_id": "pat", "messages": turns}).raise_for_status()
        client.put("/v1/users/pat/facts/timezone", json={"value": "UTC", "category": "preference"}).raise_for_status()
        client.put("/v1/users/pat/facts/timezone", json={"value": "CET", "category": "preference"}).raise_for_status()
        client.post("/v1/users/pat/memories", json={"text": "Pat likes green tea."}).raise_for_status()
        compressed = client.post("/v1/sessions/persist/compress").json()
        assert compressed["compacted"]
        wait_memorized(client, "persist", 40)
        _wait_remembered(client, "persist", compressed["covers_upto_seq"])
        memories_before = client.get("/v1/users/pat/memories", params={"limit": 1000}).json()
        blocks = -(-compressed["covers_upto_seq"] // 8)  # the summary memories of the checkpointed turns
        assert len(memories_before) == 41 + blocks and sum(m["kind"] == "summary" for m in memories_before) == blocks

    up.stop()
    assert _leftovers(up.data_dir) == [], "SIGTERM must leave no process behind"

    second_start = up.start()
    with httpx.Client(base_url=base, timeout=60) as client:
        info = client.get("/v1/sessions/persist").json()
        assert info["message_count"] == 40 and info["covers_upto_seq"] == compressed["covers_upto_seq"]
        assert info["memorized_upto_seq"] == 40
        page = client.get("/v1/sessions/persist/messages", params={"limit": 1000}).json()
        assert page["summary"] == compressed["summary"]
        assert [m["content"] for m in page["messages"]] == [t["content"] for t in turns]
        assert [h["value"] for h in client.get("/v1/users/pat/facts/timezone/history").json()] == ["UTC", "CET"]
        assert client.get("/v1/users/pat/memories", params={"limit": 1000}).json() == memories_before
        hits = client.post("/v1/users/pat/memories/search", json={"query": "what does Pat drink?", "top_k": 1}).json()
        assert hits[0]["text"] == "Pat likes green tea."
    result = up.down()
    assert result.returncode == 0, result.stderr
    up.process.wait(30)
    assert _leftovers(up.data_dir) == []
    print(f"\nmemserve up start-up: first {up.first_start_s:.1f}s, restart {second_start:.1f}s")
