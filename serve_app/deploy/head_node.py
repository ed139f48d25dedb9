"""`memserve up`'s Ray: a head node started with `ray start`, the Serve config deployed onto it by a
process that exits when the applications run, and no Ray driver kept for the service's life.

A process that calls `ray.init` owns the node it starts (the node stops when it exits), so it must
live as long as the service, and a process that deploys a Serve config imports Ray Serve, which
brings pandas and pyarrow: about 190 MiB of resident memory held only to keep the node up
(docs/benchmarks/memory.md). `ray start` starts a node that no process owns, as a cluster's
nodes are started (KubeRay runs `ray start --head` too), without what a single machine has no use
for: the autoscaler's monitor (there are no nodes to add) and the log monitor (it forwards logs to
drivers, and none stays; the logs are in the node's session directory). Every process of the node
inherits `NODE_MARKER`, which is how the node is stopped: `ray stop` would stop every Ray on the
machine.

Deploying and shutting Serve down run `python -m serve_app.deploy.head_node` as a child process,
which is the driver while it runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from serve_app.deploy.local_ray import (
    BIND_ATTEMPTS,
    NODE_ATTEMPTS,
    SIDE_PORT_VARS,
    node_defaults,
    starts_until_bound,
    throughput_env,
)
from serve_app.embedded.ports import LOOPBACK, ephemeral_low, free_listen_port

logger = logging.getLogger(__name__)

RAY = [sys.executable, "-m", "ray.scripts.scripts"]  # the `ray` CLI of this interpreter's Ray
NODE_MARKER = "MEMSERVE_RAY_NODE"
"""Set to the node's temp dir in the environment `ray start` gets: every process of the node has it."""
START_TIMEOUT_S = 120.0
STOP_GRACE_S = 15.0
GCS_GRACE_S = 2.0
MIN_WORKER_PORT = 10002  # Ray's default
WORKER_PORTS_AT_LEAST = 1000


class NodeError(RuntimeError):
    """The node did not start, or Serve could not be deployed onto it; the message says why."""


@dataclass
class HeadNode:
    temp_dir: str
    gcs_address: str
    auth_token: str
    side_ports: set[int] = field(default_factory=set)

    def client_env(self) -> dict[str, str]:
        """The environment of a process that connects to the node: its token."""
        return {**{k: v for k, v in os.environ.items() if k != "RAY_AUTH_TOKEN_PATH"}, **auth_env(self.auth_token)}

    def processes(self):
        from serve_app.runtime.processes import marked_processes

        return marked_processes(NODE_MARKER, self.temp_dir)

    def stop(self, grace_s: float = STOP_GRACE_S) -> int:
        return stop_node_processes(self.temp_dir, grace_s)


def stop_node_processes(temp_dir: str, grace_s: float = STOP_GRACE_S, killed_only: bool = True) -> int:
    """SIGTERM the node's processes (the raylet stops its workers), then its GCS, which holds only
    what the node had in memory and waits out its clients rather than leave on SIGTERM; SIGKILL
    what is left after `grace_s` each. Returns how many had to be killed (`killed_only`), else how
    many there were."""
    import psutil

    from serve_app.runtime.processes import marked_processes

    procs = marked_processes(NODE_MARKER, temp_dir)
    gcs = [p for p in procs if _is_gcs(p)]
    killed = 0
    for group in ([p for p in procs if p not in gcs], gcs):
        for proc in group:
            try:
                proc.terminate()
            except psutil.Error:
                continue
        _, alive = psutil.wait_procs(group, timeout=grace_s if group is not gcs else GCS_GRACE_S)
        for proc in alive:
            try:
                proc.kill()
                killed += 1
            except psutil.Error:
                continue
        psutil.wait_procs(alive, timeout=5)
    return killed if killed_only else len(procs)


def _is_gcs(proc) -> bool:
    import psutil

    try:
        return proc.name() == "gcs_server"
    except psutil.Error:
        return False


def auth_env(token: str) -> dict[str, str]:
    """Ray's token authentication: only a process given the token talks to the node. A token of
    its own per node, handed over in the environment: nothing in the home directory to share."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}


def node_env(temp_dir: str, chosen: dict[str, str], token: str) -> dict[str, str]:
    """The environment `ray start` gets, which every process of the node inherits: this process's
    (the stores' addresses, the data-dir marker), `chosen` (local_ray.throughput_env: Serve's
    high-throughput mode, side ports of its own), the node's token and the node marker."""
    env = {**os.environ, **chosen, **auth_env(token), NODE_MARKER: temp_dir, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    for var, value in node_defaults(temp_dir).items():
        env.setdefault(var, value)
    # Serve is shut down before the node is stopped: a raylet told to stop has nothing to drain.
    env.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")
    env.pop("RAY_ADDRESS", None)
    # The node's processes write to their log files: one that wrote to the inherited stderr would
    # hold `ray start`'s output pipe open and the start would wait for it.
    env.pop("RAY_LOG_TO_STDERR", None)
    return env


def start_argv(temp_dir: str, gcs_port: int, *, num_cpus: int | None, metrics_port: int | None) -> list[str]:
    """`ray start --head` for one machine: loopback, ports of its own (another Ray may run beside
    it: the tests and a benchmark), no dashboard, autoscaler monitor, log monitor or usage stats."""
    argv = [*RAY, "start", "--head", "--port", str(gcs_port), "--node-ip-address", LOOPBACK, "--temp-dir", temp_dir]
    argv += ["--include-dashboard", "false", "--no-monitor", "--include-log-monitor", "false", "--disable-usage-stats"]
    # Ray's fixed defaults (52365, 10001) would collide with another Ray on the machine; its workers'
    # ports stay below the range free ports are drawn from (Ray refuses a port given twice).
    argv += ["--dashboard-agent-listen-port", str(free_listen_port(LOOPBACK))]
    argv += ["--ray-client-server-port", str(free_listen_port(LOOPBACK))]
    if (top := ephemeral_low() // 2 - 1) > MIN_WORKER_PORT + WORKER_PORTS_AT_LEAST:  # else Ray's defaults
        argv += ["--min-worker-port", str(MIN_WORKER_PORT), "--max-worker-port", str(top)]
    if num_cpus:
        argv += ["--num-cpus", str(num_cpus)]
    if metrics_port:
        argv += ["--metrics-export-port", str(metrics_port)]
    return argv


def start_head(
    temp_dir: str,
    *,
    num_cpus: int | None = None,
    metrics_port: int | None = None,
    choose_port: Callable[[], int] | None = None,
    attempts: int = NODE_ATTEMPTS,
) -> HeadNode:
    """Start the node; a start that fails (on two cores beside a Milvus server one in ten times a
    raylet exits before it registers, local_ray.NODE_ATTEMPTS) is cleaned up and tried again."""
    for attempt in range(1, attempts + 1):
        chosen = throughput_env(choose_port)
        token = secrets.token_hex(32)
        env = node_env(temp_dir, chosen, token)
        gcs_port = free_listen_port(LOOPBACK)
        argv = start_argv(temp_dir, gcs_port, num_cpus=num_cpus, metrics_port=metrics_port)
        # A session of its own: Ctrl-C in `up`'s terminal reaches `up`, which stops Serve first, not
        # the raylet and the replicas at once.
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=START_TIMEOUT_S, start_new_session=True)
        except subprocess.TimeoutExpired:
            done = subprocess.CompletedProcess(argv, -1, "", f"`ray start` did not return in {START_TIMEOUT_S:.0f} s")
        if done.returncode == 0:
            side_ports = {int(chosen[var]) for var in SIDE_PORT_VARS if var in chosen}
            return HeadNode(temp_dir, f"{LOOPBACK}:{gcs_port}", token, side_ports)
        stop_node_processes(temp_dir, grace_s=5)
        reason = (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}").splitlines()[-1]
        if attempt == attempts:
            raise NodeError(f"the Ray node did not start ({attempts} attempts): {reason}")
        logger.warning("the Ray node did not start (%s): starting it again (attempt %d)", reason, attempt + 1)
    raise AssertionError("unreachable")


def _child(command: str, *args: str, timeout_s: float, env: dict[str, str] | None = None) -> str:
    """Run a step of this module in a child process; its output, or NodeError with its whole message."""
    argv = [sys.executable, "-m", __name__, command, *args]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as exc:
        raise NodeError(f"{command} took over {timeout_s:.0f} s") from exc
    if done.returncode != 0:
        raise NodeError(done.stderr.strip() or f"{command} exited {done.returncode}")
    return done.stdout


def deploy(node: HeadNode, config: Path, host: str, port: int, timeout_s: float = 180.0) -> None:
    """Deploy the config onto the node and wait until its applications run (a child process)."""
    args = ["--address", node.gcs_address, "--config", str(config), "--host", host, "--port", str(port)]
    _child("deploy", *args, timeout_s=timeout_s + 60, env=node.client_env())


def shutdown_serve(node: HeadNode, timeout_s: float = 45.0) -> None:
    """Serve's applications stopped, their replicas drained (a child process)."""
    _child("shutdown", "--address", node.gcs_address, timeout_s=timeout_s, env=node.client_env())


def serve_on_head(
    temp_dir: str,
    config: Path,
    host: str,
    port: int,
    *,
    metrics_port: int | None = None,
    after_start: Callable[[HeadNode], None] = lambda node: None,
    choose_port: Callable[[], int] | None = None,
    attempts: int = BIND_ATTEMPTS,
) -> tuple[HeadNode, int]:
    """Start the node and deploy onto it: the node and the starts it took (a side port of HAProxy
    taken by another process before HAProxy binds it costs a start on other ports,
    local_ray.starts_until_bound)."""
    nodes: list[HeadNode] = []

    def start() -> set[int]:
        nodes.append(start_head(temp_dir, metrics_port=metrics_port, choose_port=choose_port))
        after_start(nodes[-1])
        return nodes[-1].side_ports

    starts = starts_until_bound(start, lambda: deploy(nodes[-1], config, host, port), lambda: nodes[-1].stop(), attempts)
    return nodes[-1], starts


def check_config(config: Path, host: str, port: int) -> dict:
    """The config validated as Serve reads it, in a child process (Serve's schema imports Serve):
    its HTTP options and the application's args, or NodeError with the problem."""
    out = _child("check", "--config", str(config), "--host", host, "--port", str(port), timeout_s=120)
    return json.loads(out.strip().splitlines()[-1])


# What the child process does (`python -m serve_app.deploy.head_node COMMAND`).


def _check(args: argparse.Namespace) -> None:
    from serve_app.deploy.serve_config import load_serve_config

    try:
        loaded = load_serve_config(args.config, host=args.host, port=args.port)
    except Exception as exc:  # the message is the point: the parent prints it
        sys.exit(f"{exc}")
    http = loaded.http_options
    print(json.dumps({"host": http.host, "port": http.port, "args": loaded.applications[0].args}))


def _deploy(args: argparse.Namespace) -> None:
    import ray

    from serve_app.deploy.local_ray import deploy_config
    from serve_app.deploy.serve_config import load_serve_config

    loaded = load_serve_config(args.config, host=args.host, port=args.port)
    ray.init(address=args.address, namespace="serve", log_to_driver=False)
    try:
        deploy_config(loaded)
    finally:
        ray.shutdown()


def _shutdown(args: argparse.Namespace) -> None:
    import ray
    from ray import serve

    ray.init(address=args.address, namespace="serve", log_to_driver=False)
    try:
        serve.shutdown()
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description="memserve up's steps that import Ray Serve, each in a process of its own.")
    parser.add_argument("command", choices=["check", "deploy", "shutdown"])
    parser.add_argument("--address", default="")
    parser.add_argument("--config", type=Path)
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    args = parser.parse_args()
    {"check": _check, "deploy": _deploy, "shutdown": _shutdown}[args.command](args)


if __name__ == "__main__":
    main()
