"""`memserve`: run the service on embedded backends (`up`), stop it (`down`)."""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import threading
import time
from pathlib import Path

import typer

from serve_app.core.auth import hash_key, is_loopback, new_key
from serve_app.embedded.backend import LaunchError
from serve_app.embedded.launchers import MILVUS_ENGINES, EmbeddedBackends, Ports
from serve_app.runtime.processes import marked_processes, pid_alive
from serve_app.settings import Settings

cli = typer.Typer(add_completion=False, help="agent-memory-serve: memory for LLM agents on Ray Serve.")
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "local.yaml"
EXTERNAL_VARS = ("REDIS_URL", "POSTGRES_DSN", "MILVUS_URI")
DATA_DIR_MARKER = "MEMSERVE_UP_DATA_DIR"
# SIGHUP too: a closed terminal or ssh session stops `up` cleanly, where its default would end `up`
# and leave the Ray node running (it is not `up`'s child process group).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _run_dir(data_dir: Path) -> Path:
    path = data_dir / "run"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _say(message: str) -> None:
    print(message, flush=True)


@cli.command()
def up(
    data_dir: Path = typer.Option(Path(".memserve"), help="Where Redis, PostgreSQL and Milvus keep their data."),
    host: str = typer.Option("127.0.0.1", help="HTTP host of the API."),
    port: int = typer.Option(8000, help="HTTP port of the API."),
    config: Path = typer.Option(DEFAULT_CONFIG, help="Ray Serve config file (configs/local.yaml)."),
    redis_port: int = typer.Option(Ports.redis, help="Embedded Redis port (loopback)."),
    postgres_port: int = typer.Option(Ports.postgres, help="Embedded PostgreSQL port (loopback)."),
    milvus_port: int = typer.Option(Ports.milvus, help="Embedded Milvus port (loopback)."),
    milvus_engine: str = typer.Option(
        MILVUS_ENGINES[0],
        envvar="MEMSERVE_MILVUS_ENGINE",
        help="Embedded Milvus: 'server' (Milvus 2.3 standalone from the milvus wheel: HNSW, partition pruning) or "
        "'lite' (Milvus Lite, one Python process; its search walks the user's rows).",
    ),
    metrics_port: int = typer.Option(8080, help="Prometheus metrics port of Ray (0 to disable)."),
    embedded: bool = typer.Option(
        None, help="Start embedded backends. Default: yes, unless REDIS_URL, POSTGRES_DSN and MILVUS_URI are all set."
    ),
) -> None:
    """Start the backends and the Serve app; stop everything on Ctrl-C or SIGTERM."""
    from serve_app.deploy.head_node import HeadNode, NodeError, check_config, serve_on_head
    from serve_app.deploy.local_ray import ray_temp_dir

    started = time.monotonic()
    data_dir = data_dir.resolve()
    try:
        serve_config = check_config(config, host, port)
    except NodeError as exc:
        _say(f"error: {exc}")
        raise typer.Exit(2) from exc
    try:
        keyring = Settings(**serve_config["args"]).keyring()
    except (ValueError, OSError) as exc:  # bad settings, a missing or malformed key file
        _say(f"error: {exc}")
        raise typer.Exit(2) from exc
    if not is_loopback(host) and not keyring.enabled:
        _say(
            f"error: refusing to serve on {host} without API keys: anyone who can reach it could read every "
            "memory. Configure api_keys or api_keys_file (memserve hash-key makes one), or bind 127.0.0.1."
        )
        raise typer.Exit(2)
    use_embedded = embedded if embedded is not None else not all(os.environ.get(v) for v in EXTERNAL_VARS)
    run_dir = _run_dir(data_dir)
    pid_file = run_dir / "memserve.pid"
    if pid_file.exists() and pid_alive(int(pid_file.read_text() or 0)):
        _say(f"error: memserve is already running on {data_dir} (pid {pid_file.read_text()}); run memserve down")
        raise typer.Exit(1)
    pid_file.write_text(str(os.getpid()))
    os.environ[DATA_DIR_MARKER] = str(data_dir)  # inherited by every child: `down` finds them by it

    stop = threading.Event()
    for sig in STOP_SIGNALS:
        signal.signal(sig, _stop_handler(stop))
    # The node does not die with `up` (it is `ray start`'s): what an `up` killed outright left of
    # it on this data dir would hold the ports this one needs.
    from serve_app.deploy.head_node import stop_node_processes

    temp_dir = ray_temp_dir(data_dir)
    if left := stop_node_processes(temp_dir, grace_s=5, killed_only=False):
        _say(f"stopped {left} processes of a Ray node an earlier `up` left running")

    node: HeadNode | None = None
    backends = EmbeddedBackends(data_dir, Ports(redis_port, postgres_port, milvus_port), milvus_engine=milvus_engine)
    try:
        if use_embedded:
            try:
                backends.start()
            except LaunchError as exc:
                _say(f"error: {exc}")
                raise typer.Exit(1) from exc
            os.environ.update(backends.app_env)
            _write_backends(run_dir, backends)
            for name, backend in backends.backends.items():
                _say(f"{name:<9} {backend.url}  (log {backend.log_path})")
        else:
            for var in EXTERNAL_VARS:
                _say(f"{var:<13} {os.environ.get(var, '(default)')}")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        # Every Ingress replica signs and checks inspector cookies with the same secret: one kept
        # in the data dir, so a restart keeps the sessions signed in.
        os.environ.setdefault("MEMSERVE_UI_SECRET", _ui_secret(data_dir))

        def on_node_started(started_node: HeadNode) -> None:
            nonlocal node
            node = started_node
            _say(f"deploying {config.name} (the replicas start and load the model)…")

        # A side port of HAProxy taken by another process meanwhile costs another start of Ray, not this one.
        serve_on_head(temp_dir, config, host, port, metrics_port=metrics_port or None, after_start=on_node_started)
        http_host, http_port = serve_config["host"], serve_config["port"]
        _say(f"api       http://{http_host}:{http_port}  (docs http://{http_host}:{http_port}/docs)")
        _say(f"inspector http://{http_host}:{http_port}/ui")
        if metrics_port:
            _say(f"metrics   http://127.0.0.1:{metrics_port}/metrics")
        _say(f"logs      {Path(temp_dir) / 'session_latest' / 'logs'} (serve/: the replicas')")
        _say(f"ready in {time.monotonic() - started:.1f}s; Ctrl-C or `memserve down --data-dir {data_dir}` stops it")
        while not stop.wait(1.0):
            if use_embedded:
                _start_exited(backends, run_dir)
    except _StopRequested:
        pass
    except NodeError as exc:
        _say(f"error: {exc}")
        raise typer.Exit(1) from exc
    finally:
        for sig in STOP_SIGNALS:  # a second signal must not cut the cleanup short
            signal.signal(sig, signal.SIG_IGN)
        _say("stopping…")
        _stop_node(temp_dir, node)
        backends.stop()
        pid_file.unlink(missing_ok=True)
        (run_dir / "backends.json").unlink(missing_ok=True)
        _say("stopped")


def _write_backends(run_dir: Path, backends: EmbeddedBackends) -> None:
    """Atomically (a temp file renamed over it): `down` may read it while a restart rewrites it."""
    servers = {name: {"pid": b.process.pid, "url": b.url} for name, b in backends.backends.items()}
    staging = run_dir / f".backends.json.{os.getpid()}"
    staging.write_text(json.dumps(servers))
    os.replace(staging, run_dir / "backends.json")


def _start_exited(backends: EmbeddedBackends, run_dir: Path) -> None:
    """Start again, on its own data, an embedded server that exited by itself (a crash, an OOM kill),
    as a supervisor would: every acknowledged write is on its disk, and the replicas reconnect on
    their own. One that does not come back is tried again at the next turn of the loop."""
    for name, backend in list(backends.backends.items()):
        if backend.alive():
            continue
        _say(f"{name} exited (code {backend.process.returncode}): starting it again (log {backend.log_path})")
        try:
            backends.restart(name)
        except LaunchError as exc:
            _say(f"{name} did not start again: {exc}")
            continue
        _write_backends(run_dir, backends)
        _say(f"{name} started again")


def _ui_secret(data_dir: Path) -> str:
    path = data_dir / "ui_secret"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32))
    return path.read_text().strip()


class _StopRequested(BaseException):
    """Raised in the main thread by SIGINT/SIGTERM to leave whatever `up` was waiting on. A
    BaseException, as KeyboardInterrupt is: the signal lands in whatever runs, Ray's code during a
    deploy, and library code that turns any `Exception` into an error of its own must let it by."""


def _stop_handler(stop: threading.Event):
    def handle(signum, frame) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)  # a second signal must not interrupt the cleanup
        stop.set()
        raise _StopRequested()

    return handle


def _stop_node(temp_dir: str, node) -> None:
    """Serve first (its replicas drain), then the node's processes, whatever became of the first:
    also those of a node whose start was interrupted, which `node` does not name yet."""
    from serve_app.deploy.head_node import shutdown_serve, stop_node_processes

    if node is not None and node.processes():  # a start that failed has stopped its node already
        try:
            shutdown_serve(node)
        except Exception as exc:  # shutting down: report and carry on stopping the rest
            print(f"warning: serve shutdown: {exc}", file=sys.stderr)
    stop_node_processes(temp_dir)


@cli.command()
def down(
    data_dir: Path = typer.Option(Path(".memserve"), help="The data dir `memserve up` was started with."),
    timeout_s: float = typer.Option(60.0, help="Seconds to wait for a clean stop before killing."),
) -> None:
    """Stop a running `memserve up` and everything it started; leaves no process behind."""
    data_dir = data_dir.resolve()
    run_dir = _run_dir(data_dir)
    pid_file = run_dir / "memserve.pid"
    pid = int(pid_file.read_text() or 0) if pid_file.exists() else 0
    if pid_alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
    leftovers = []
    backends_file = run_dir / "backends.json"
    if backends_file.exists():
        leftovers += [info["pid"] for info in json.loads(backends_file.read_text()).values()]
    leftovers += [proc.pid for proc in marked_processes(DATA_DIR_MARKER, str(data_dir))]
    if pid_alive(pid):
        leftovers.append(pid)
    killed = 0
    # `up` first: while it runs it starts again a server that exits.
    for leftover in sorted(set(leftovers), key=lambda p: p != pid):
        if pid_alive(leftover):
            try:
                os.kill(leftover, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    pid_file.unlink(missing_ok=True)
    backends_file.unlink(missing_ok=True)
    _say("stopped" + (f" ({killed} leftover processes killed)" if killed else ""))


@cli.command("hash-key")
def hash_key_command(
    tenant: str = typer.Argument(..., help="Tenant the key gives access to."),
    key: str = typer.Option("", help="An existing key; default: generate a new one."),
) -> None:
    """Print a new API key and the `<tenant>:<sha256>` line for api_keys_file (only the hash is stored)."""
    key = key or new_key()
    _say(f"key (give to the client, not stored): {key}")
    _say(f"api_keys_file line: {tenant}:{hash_key(key)}")


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
