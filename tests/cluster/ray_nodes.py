"""Two real Ray nodes on this machine, started with `ray start` as a cluster's nodes are.

Each node gets ports of its own (GCS, node manager, object manager, agents, workers, metrics), a
small object store, and, for Serve's HAProxy mode, its own HAProxy files and side ports; the
worker node's proxy binds `RAY_SERVE_WORKER_PROXY_HTTP_PORT` (Ray's override for proxies that share
a machine). Each `ray start --block` runs in a process group of its own, so stopping one never
touches another Ray on the machine (`ray stop` would stop them all).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from serve_app.deploy.local_ray import THROUGHPUT_ENV
from serve_app.embedded.ports import LOOPBACK, free_listen_port
from serve_app.runtime.processes import marked_processes

RAY = str(Path(sys.executable).with_name("ray"))
SERVE = str(Path(sys.executable).with_name("serve"))
OBJECT_STORE_BYTES = 100 * 1024 * 1024
# Ray's token authentication, on for both nodes and Ray's CLIs. `ray start` refuses to start in
# token mode without a token (only `ray.init` makes one, in ~/.ray), so the harness makes its own per
# process and hands it over in RAY_AUTH_TOKEN: a fresh machine needs nothing in the home directory.
AUTH_TOKEN = uuid.uuid4().hex
AUTH_ENV = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": AUTH_TOKEN}
CLI_ENV = {**{k: v for k, v in os.environ.items() if k != "RAY_AUTH_TOKEN_PATH"}, **AUTH_ENV}
NODES_MARKER = "MEMSERVE_TEST_RAY_NODES"
"""Set in both nodes' environment to their short dir: every process they start inherits it, so a stop
finds what outlived the nodes' process groups (an HAProxy that Serve's proxy actor spawned or
reloaded, left running when the actor is killed, holding its ports for the tests after)."""


@dataclass
class RayNode:
    name: str
    process: subprocess.Popen
    node_manager_port: int
    http_port: int
    log_path: Path

    def raylet(self) -> psutil.Process:
        """The node's raylet, found by its own node manager port."""
        flag = f"--node_manager_port={self.node_manager_port}"
        for proc in psutil.Process(self.process.pid).children(recursive=True):
            try:
                if proc.name() == "raylet" and flag in proc.cmdline():
                    return proc
            except psutil.NoSuchProcess:
                continue
        raise LookupError(f"no raylet with {flag}")

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@dataclass
class TwoNodes:
    head: RayNode
    worker: RayNode
    gcs_address: str
    dashboard_url: str
    short_dir: Path

    def stop(self) -> None:
        self.worker.stop()
        self.head.stop()
        _end_leftovers(self.short_dir)
        shutil.rmtree(self.short_dir, ignore_errors=True)

    def serve_deploy(self, config_path: Path) -> None:
        subprocess.run([SERVE, "deploy", str(config_path), "--address", self.dashboard_url], check=True, timeout=120, env=CLI_ENV)

    def serve_details(self) -> dict:
        return httpx.get(f"{self.dashboard_url}/api/serve/applications/", headers=dashboard_headers(), timeout=10).json()

    def nodes(self) -> dict[str, bool]:
        """Alive node id -> whether it is the head."""
        argv = [RAY, "list", "nodes", "--address", self.gcs_address, "--filter", "state=ALIVE", "--format", "json"]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=CLI_ENV)
        if out.returncode != 0:
            raise RuntimeError(f"ray list nodes: {out.stderr[-500:]}")
        if not out.stdout.lstrip().startswith("["):  # "No resource in the cluster" while a node starts
            return {}
        return {n["node_id"]: bool(n["is_head_node"]) for n in json.loads(out.stdout)}


def _end_leftovers(short: Path) -> None:
    """Kill every process the nodes started that is still running (`NODES_MARKER`)."""
    for proc in marked_processes(NODES_MARKER, str(short)):
        with contextlib.suppress(psutil.Error):  # ended meanwhile
            proc.kill()


def _node_env(base: dict[str, str], short: Path, name: str, worker_http_port: int | None) -> dict[str, str]:
    haproxy = short / f"hap-{name}"
    haproxy.mkdir(parents=True, exist_ok=True)
    env = {
        **base,
        **THROUGHPUT_ENV,
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(haproxy / "haproxy.cfg"),
        "RAY_SERVE_HAPROXY_SOCKET_PATH": str(haproxy / "admin.sock"),
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(haproxy),
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(haproxy / "server-state"),
        "RAY_SERVE_HAPROXY_STATS_PORT": str(free_listen_port(LOOPBACK)),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_listen_port(LOOPBACK)),
        "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(free_listen_port(LOOPBACK)),
        "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": str(free_listen_port(LOOPBACK)),
        "RAY_USAGE_STATS_ENABLED": "0",
        NODES_MARKER: str(short),
        # SIGTERM stops a node only when a test is over: no traffic is left for Ray to drain it of
        # (it would wait 30 s for a head whose Serve replicas never go idle).
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        **AUTH_ENV,
    }
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    if worker_http_port is not None:
        env["RAY_SERVE_WORKER_PROXY_HTTP_PORT"] = str(worker_http_port)
        env["RAY_SERVE_WORKER_PROXY_GRPC_PORT"] = str(free_listen_port(LOOPBACK))
    return env


NODE_PORT_FLAGS = (
    "--node-manager-port",
    "--object-manager-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--runtime-env-agent-port",
    "--metrics-export-port",
)


def _node_ports(worker_base: int) -> list[str]:
    """A node's ports. Its workers' range sits below the range `free_listen_port` draws from."""
    argv = [arg for flag in NODE_PORT_FLAGS for arg in (flag, str(free_listen_port(LOOPBACK)))]
    return [*argv, "--min-worker-port", str(worker_base), "--max-worker-port", str(worker_base + 199)]


def _start(name: str, argv: list[str], env: dict[str, str], root: Path, http_port: int) -> RayNode:
    log_path = root / f"ray-{name}.log"
    log = open(log_path, "ab")  # noqa: SIM115 - the node's process owns it
    process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    port = int(argv[argv.index("--node-manager-port") + 1])
    return RayNode(name, process, port, http_port, log_path)


def start_two_nodes(root: Path, env: dict[str, str], head_http_port: int, worker_http_port: int) -> TwoNodes:
    """A head (GCS, dashboard for `serve deploy`, 2 CPUs) and a worker node (2 CPUs) that joined it."""
    # A short directory for Ray's temp dir and HAProxy's files: their Unix sockets live there, and
    # socket paths are limited (107 bytes for Ray, 97 for HAProxy's admin socket).
    short = Path(tempfile.mkdtemp(prefix="msn-", dir="/tmp"))
    gcs_port, dashboard_port = free_listen_port(LOOPBACK), free_listen_port(LOOPBACK)
    common = ["--block", "--node-ip-address", LOOPBACK, "--num-cpus", "2", "--object-store-memory", str(OBJECT_STORE_BYTES)]
    common += ["--disable-usage-stats"]
    head_argv = [RAY, "start", "--head", "--port", str(gcs_port), *common, *_node_ports(10000)]
    head_argv += ["--include-dashboard", "true", "--dashboard-host", LOOPBACK, "--dashboard-port", str(dashboard_port)]
    head_argv += ["--ray-client-server-port", str(free_listen_port(LOOPBACK)), "--temp-dir", str(short / "ray")]
    head = _start("head", head_argv, _node_env(env, short, "head", None), root, head_http_port)
    dashboard = f"http://{LOOPBACK}:{dashboard_port}"
    gcs = f"{LOOPBACK}:{gcs_port}"
    worker: RayNode | None = None
    try:
        _wait_http(f"{dashboard}/api/version", 120, head)
        worker_argv = [RAY, "start", "--address", gcs, *common, *_node_ports(10200)]
        worker = _start("worker", worker_argv, _node_env(env, short, "worker", worker_http_port), root, worker_http_port)
        nodes = TwoNodes(head, worker, gcs, dashboard, short)
        deadline = time.monotonic() + 120
        while len(nodes.nodes()) < 2:
            if time.monotonic() > deadline or worker.process.poll() is not None:
                raise RuntimeError(f"the worker node did not join: see {worker.log_path}")
            time.sleep(1)
        return nodes
    except BaseException:
        for node in (worker, head):
            if node is not None:
                node.stop()
        _end_leftovers(short)
        shutil.rmtree(short, ignore_errors=True)
        raise


def dashboard_headers() -> dict[str, str]:
    """The nodes' token as Ray's CLIs send it to the dashboard."""
    return {"Authorization": f"Bearer {AUTH_TOKEN}"}


def _wait_http(url: str, timeout_s: float, node: RayNode) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if node.process.poll() is not None:
            raise RuntimeError(f"ray start exited: see {node.log_path}")
        try:
            if httpx.get(url, headers=dashboard_headers(), timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer in {timeout_s}s")
