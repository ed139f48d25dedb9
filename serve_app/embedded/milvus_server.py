"""A real Milvus standalone server from the `milvus` wheel (2.3): HNSW, partition pruning, flush and
restart behaviour of a server, on loopback, with its data under one directory.

The wheel's own `MilvusServer` gives the binary one second to stop before killing it and picks its
ports anew on every start, so this module uses only its config renderer and unpacker and runs the
binary itself: one process group, stopped with SIGTERM like the other backends, and the same ports
on every start (kept in `ports.json`), so its embedded etcd finds the member it was.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import NamedTuple

from serve_app.embedded.backend import Backend, LaunchError, ensure_port_free, spawn, wait_until_up
from serve_app.embedded.ports import LOOPBACK, free_listen_port
from serve_app.runtime.cache import cache_base

# Milvus's internal servers, each on a port of its own (the wheel's config names them so).
INTERNAL_PORTS = (
    "root_coord_port",
    "proxy_internal_port",
    "query_coord_port",
    "query_node_port",
    "index_coord_port",
    "index_node_port",
    "data_coord_port",
    "data_node_port",
)
ROLES = ("rootCoord", "proxy", "queryCoord", "queryNode", "indexCoord", "indexNode", "dataCoord", "dataNode")
# Extra settings over the wheel's template (dotted keys of milvus.yaml).
SERVER_SETTINGS: dict[str, object] = {
    # Two DML channels instead of sixteen: one machine, and each channel costs a consumer and ticks.
    "rootCoord.dmlChannelNum": 2,
    # How long a component's etcd session outlives its last renewal. A process that a busy machine
    # starves for longer loses its sessions and stops serving until it is restarted. A dead
    # process's sessions would hold up the next start this long: the launcher deletes them.
    "common.session.ttl": 30,
    # How often the proxy stamps time on the channels; a Strong read (a delete shown, a write read
    # back) waits for the next stamp. Half the default halves that wait for about 0.015 of a core
    # at idle (docs/benchmarks/engines.md).
    "proxy.timeTickInterval": 100,
    # Loopback only: by default each role advertises the machine's first address.
    **{f"{role}.ip": LOOPBACK for role in ROLES},
}
# Where the components register their sessions: the template's etcd.rootPath and metaSubPath.
SESSION_PREFIX = "by-dev/meta/session/"
# On SIGTERM Milvus 2.3 standalone stops its coordinators (each revokes its session) within
# milliseconds, then hangs stopping its nodes, which retry the coordinators that are gone: a short
# grace, then SIGKILL, which its write-ahead log (rocksmq) survives; the sessions the nodes leave
# behind are dropped by the next start (`drop_stale_sessions`).
STOP_GRACE_S = 1.0


def _ports(directory: Path, proxy_port: int) -> dict[str, int]:
    """This data directory's ports: chosen once, then the same on every start."""
    path = directory / "ports.json"
    try:
        ports = json.loads(path.read_text())
    except (OSError, ValueError):
        names = (*INTERNAL_PORTS, "etcd_port", "etcd_peer_port", "metrics_port")
        ports = {name: free_listen_port(LOOPBACK) for name in names}
    ports["proxy_port"] = proxy_port
    path.write_text(json.dumps(ports))
    return ports


def _etcd_config(directory: Path, ports: dict[str, int]) -> Path:
    """The embedded etcd's own config: by default it listens on 2379/2380, which a second server
    (or any etcd of the machine) already holds."""
    peer = f"http://{LOOPBACK}:{ports['etcd_peer_port']}"
    client = f"http://{LOOPBACK}:{ports['etcd_port']}"
    path = directory / "configs" / "etcd.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"name: default\nlisten-peer-urls: {peer}\ninitial-advertise-peer-urls: {peer}\n"
        f"initial-cluster: default={peer}\nlisten-client-urls: {client}\nadvertise-client-urls: {client}\n"
    )
    return path


def _etcd(port: int, method: str, body: dict) -> dict:
    """One call to the embedded etcd's JSON gateway (keys and values in base64)."""
    request = urllib.request.Request(f"http://{LOOPBACK}:{port}/v3/{method}", data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=2) as response:
        return json.loads(response.read())


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class Session(NamedTuple):
    """A component's registration in etcd: its key (base64, as the gateway gives it), the revision
    it was last written at, and the ServerID of the process that wrote it."""

    key: str
    revision: str
    server_id: int


def read_sessions(etcd_port: int) -> list[Session]:
    """The component sessions registered in the embedded etcd (the ServerID counter left out)."""
    found = _etcd(etcd_port, "kv/range", {"key": _b64(SESSION_PREFIX), "range_end": _b64(SESSION_PREFIX[:-1] + "0")})
    sessions = []
    for entry in found.get("kvs", []):
        try:
            server_id = int(json.loads(base64.b64decode(entry["value"]))["ServerID"])
        except (ValueError, KeyError, TypeError):
            continue  # the ServerID counter, or anything else that is not a session
        sessions.append(Session(entry["key"], entry["mod_revision"], server_id))
    return sessions


def stale_sessions(sessions: list[Session]) -> list[Session]:
    """The sessions of processes that are gone. The embedded etcd runs inside the Milvus process, so
    one process at a time uses it, and every component of a standalone process registers under the
    same ServerID, allocated anew (higher) on each start: a session with a lower ServerID than the
    newest is a dead process's. Before the new process registers, none is known to be stale."""
    newest = max((session.server_id for session in sessions), default=0)
    return [session for session in sessions if session.server_id < newest]


def drop_stale_sessions(etcd_port: int) -> int:
    """Delete the sessions of this data directory's previous process once the new one has registered.

    A process that did not revoke its sessions (killed, or hung in its own shutdown and then killed)
    leaves them in etcd until their lease runs out, `common.session.ttl` after the restart, and until
    then the new process's coordinators wait for the dead nodes and the exclusive coordinator keys
    stay taken, so a restart would wait out the whole TTL. Each is deleted only if unchanged since
    it was read (a compare on its revision), which is what its lease running out would do. Returns
    how many were deleted."""
    try:
        sessions = read_sessions(etcd_port)
    except (OSError, ValueError):
        return 0  # etcd is not up yet
    dropped = 0
    for session in stale_sessions(sessions):
        unchanged = {"key": session.key, "target": "MOD", "result": "EQUAL", "mod_revision": session.revision}
        delete = {"request_delete_range": {"key": session.key}}
        try:
            result = _etcd(etcd_port, "kv/txn", {"compare": [unchanged], "success": [delete]})
        except (OSError, ValueError):
            break
        dropped += bool(result.get("succeeded"))
    return dropped


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/healthz", timeout=1) as response:
            return b"OK" in response.read()
    except (OSError, urllib.error.URLError):
        return False


def _serving(port: int) -> bool:
    """Every collection that was loaded is loaded again and answers a Strong read: after a crash the
    server reports healthy well before it has replayed its log, and until then a read that does not
    wait answers from part of the data."""
    from pymilvus import MilvusClient
    from pymilvus.client.types import LoadState

    from serve_app.stores.vectors import GRPC_OPTIONS

    client = None
    try:
        client = MilvusClient(uri=f"http://{LOOPBACK}:{port}", timeout=5, grpc_options=GRPC_OPTIONS)
        for name in client.list_collections(timeout=5):
            state = client.get_load_state(name, timeout=5).get("state")
            if state == LoadState.NotLoad:
                continue
            if state != LoadState.Loaded:
                return False
            client.query(name, filter="", limit=1, output_fields=["id"], consistency_level="Strong", timeout=5)
        return True
    except Exception:  # a readiness probe: any failure (refused, deadline, not loaded yet) means not yet
        return False
    finally:
        if client is not None:
            client.close()


def serving(port: int, wait_s: float = 3.0) -> bool:
    """`_serving`, in a process of its own unless this one has imported pymilvus already: pymilvus
    brings pandas and pyarrow, about 100 MiB that `memserve up` would hold for the service's life to
    ask this a few times at start. The child asks until it passes or `wait_s` is over: briefly, so
    the caller's loop still notices a server that exits and drops stale sessions between asks."""
    if "pymilvus" in sys.modules:
        return _serving(port)
    argv = [sys.executable, "-m", __name__, "--serving", str(port), "--wait-s", str(wait_s)]
    try:
        return subprocess.run(argv, capture_output=True, timeout=wait_s + 60).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _wait_serving(port: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while not _serving(port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _unpacked_binaries(milvus) -> Path:
    """The wheel's binary and libraries (about 250 MB), unpacked once per machine and version and
    shared by every data directory; under a lock, so no start runs a binary another is still writing."""
    base = cache_base() / f"milvus-server-{milvus.__version__}"
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        milvus._initialize_data_files(str(base))  # skips files whose checksum is already there
    return base / "bin"


def start_milvus_server(data_dir: Path, port: int, timeout_s: float = 120) -> Backend:
    """Milvus standalone (embedded etcd, rocksmq, local storage) serving gRPC on `port`."""
    try:
        import milvus
    except ImportError as exc:
        raise LaunchError("the Milvus server engine needs the `milvus` wheel (a dependency: reinstall the package)") from exc
    directory = (data_dir / "milvus-server").resolve()
    directory.mkdir(parents=True, exist_ok=True)
    ports = _ports(directory, port)
    config = milvus.MilvusServerConfig(data_dir=str(directory))
    for key, value in SERVER_SETTINGS.items():
        config.set(key, value)
    # The wheel's `resolve()` would test-bind each port without SO_REUSEADDR and so refuse the ports
    # of a server that just stopped (their connections linger in TIME_WAIT): render the config directly.
    config.resolve_storage()
    for name, value in ports.items():
        config.set(name, value)
    config.write_config()
    ensure_port_free(port, "milvus")
    binary = _unpacked_binaries(milvus) / "milvus"
    env = {
        **os.environ,
        "DEPLOY_MODE": "STANDALONE",
        "METRICS_PORT": str(ports["metrics_port"]),
        "MILVUS_RUN_DIR": str(directory / "run"),
        # Milvus reads ETCD_CONFIG_PATH as etcd.config.path, which the wheel's template lacks.
        "ETCD_CONFIG_PATH": str(_etcd_config(directory, ports)),
        "LD_LIBRARY_PATH": ":".join(p for p in (str(binary.parent), os.environ.get("LD_LIBRARY_PATH", "")) if p),
    }
    log_path = data_dir / "logs" / "milvus-server.log"
    process = spawn("milvus", [str(binary), "run", "standalone"], log_path, cwd=str(directory), env=env)
    backend = Backend("milvus", process, f"http://{LOOPBACK}:{port}", log_path, stop_timeout_s=STOP_GRACE_S)

    def ready() -> bool:
        drop_stale_sessions(ports["etcd_port"])
        return _healthy(ports["metrics_port"]) and serving(port)

    wait_until_up(ready, backend, timeout_s)
    return backend


def main() -> None:
    parser = argparse.ArgumentParser(description="Whether an embedded Milvus server serves its collections (exit 0).")
    parser.add_argument("--serving", type=int, required=True, help="The server's gRPC port.")
    parser.add_argument("--wait-s", type=float, default=3.0, help="Ask again until this is over.")
    args = parser.parse_args()
    sys.exit(0 if _wait_serving(args.serving, args.wait_s) else 1)


if __name__ == "__main__":
    main()
