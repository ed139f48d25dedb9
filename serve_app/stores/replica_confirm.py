"""Which command confirms a write on replicas, and how many replicas its reply counts.

Pure: chosen from what the primaries report (INFO), so the choice is tested without a server.
WAITAOF (Redis 7.2) waits until replicas have the write in their append-only file, fsynced;
WAIT only until they received it, which is all an older server offers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

WAITAOF_SINCE = (7, 2, 0)


def server_version(info: dict[str, Any]) -> tuple[int, int, int]:
    """The server's version from INFO server (`redis_version`; Valkey reports its Redis-compatible one there)."""
    found = re.match(r"(\d+)\.(\d+)\.(\d+)", str(info.get("redis_version", "")))
    if found is None:
        raise ValueError(f"INFO reports no redis_version: {info.get('redis_version')!r}")
    major, minor, patch = (int(part) for part in found.groups())
    return major, minor, patch


@dataclass(frozen=True)
class Confirmation:
    """Wait for `replicas` replicas, at most `timeout_ms`, after a connection's writes."""

    replicas: int
    timeout_ms: int
    waitaof: bool
    local_aof: bool = True
    """WAITAOF's local fsync too; only where the primary keeps an append-only file (else it refuses)."""

    @property
    def name(self) -> str:
        return "WAITAOF" if self.waitaof else "WAIT"

    def commands(self) -> list[tuple[Any, ...]]:
        """What follows the write on its connection. WAITAOF goes after a WAIT: sent right behind the
        write, a lone WAITAOF waits for the replicas' periodic acknowledgement (Valkey 9 here),
        while behind a WAIT the replicas already hold the write and report its fsync at once. Each
        waits at most `timeout_ms`."""
        wait = ("WAIT", self.replicas, self.timeout_ms)
        if self.waitaof:
            return [wait, ("WAITAOF", 1 if self.local_aof else 0, self.replicas, self.timeout_ms)]
        return [wait]

    def confirmed(self, replies: list[Any]) -> int:
        """Replicas that confirmed, from the replies to `commands` (WAITAOF answers [local, replicas])."""
        return int(replies[-1][1]) if self.waitaof else int(replies[-1])


def choose(infos: list[dict[str, Any]], replicas: int, timeout_ms: int) -> Confirmation:
    """The confirmation every primary of `infos` (INFO server and persistence) can run: WAITAOF only
    if all have it, since a rolling upgrade leaves old and new primaries side by side."""
    if not infos:
        raise ValueError("no primary to choose a confirmation for")
    waitaof = all(server_version(info) >= WAITAOF_SINCE for info in infos)
    local_aof = all(str(info.get("aof_enabled", "0")) == "1" for info in infos)
    return Confirmation(replicas=replicas, timeout_ms=timeout_ms, waitaof=waitaof, local_aof=local_aof)


def connected_replicas(info: dict[str, Any]) -> int:
    """Replicas a primary streams to now (INFO replication)."""
    return int(info.get("connected_slaves", 0))


def replica_lag_bytes(info: dict[str, Any]) -> int:
    """How far the furthest-behind online replica trails the primary's replication offset (INFO
    replication); 0 without replicas. What a failover to that replica would lose, unconfirmed."""
    primary = int(info.get("master_repl_offset", 0))
    offsets = [
        int(entry["offset"])
        for name, entry in info.items()
        if re.fullmatch(r"slave\d+", name) and isinstance(entry, dict) and entry.get("state") == "online"
    ]
    return max((primary - offset for offset in offsets), default=0)
