"""Choosing the confirmation command from what the primaries report, and reading its reply."""

from __future__ import annotations

import pytest

from serve_app.stores.redis_client import sentinel_target
from serve_app.stores.replica_confirm import Confirmation, choose, replica_lag_bytes, server_version


def _info(version: str, aof: str = "1") -> dict:
    return {"redis_version": version, "aof_enabled": aof}


@pytest.mark.parametrize(
    ("version", "command"),
    [
        ("6.2.12", "WAIT"),
        ("7.0.15", "WAIT"),
        ("7.1.242", "WAIT"),
        ("7.2.0", "WAITAOF"),
        ("7.2.4", "WAITAOF"),  # what Valkey reports as its Redis-compatible version
        ("7.4.0", "WAITAOF"),
        ("8.0.2", "WAITAOF"),
    ],
)
def test_waitaof_from_redis_7_2_wait_before(version, command):
    assert choose([_info(version)], replicas=1, timeout_ms=500).name == command


def test_waitaof_only_when_every_primary_has_it():
    """A rolling upgrade leaves old primaries beside new ones: one old primary means WAIT everywhere."""
    assert choose([_info("7.4.0"), _info("7.0.15"), _info("7.4.0")], 1, 500).name == "WAIT"


def test_the_commands_sent():
    assert choose([_info("6.2.6")], 2, 750).commands() == [("WAIT", 2, 750)]
    assert choose([_info("7.4.0")], 1, 500).commands() == [("WAIT", 1, 500), ("WAITAOF", 1, 1, 500)]
    # WAITAOF refuses a local fsync on a primary without an append-only file: wait for replicas only.
    assert choose([_info("7.4.0", aof="0")], 1, 500).commands()[-1] == ("WAITAOF", 0, 1, 500)


def test_replicas_counted_from_each_reply():
    assert Confirmation(replicas=1, timeout_ms=1, waitaof=False).confirmed([1]) == 1
    # Received by the replica (WAIT) is not enough: WAITAOF's count of fsynced replicas decides.
    assert Confirmation(replicas=1, timeout_ms=1, waitaof=True).confirmed([1, [1, 0]]) == 0


def test_a_version_that_cannot_be_read_is_refused():
    with pytest.raises(ValueError):
        server_version({"redis_version": "unknown"})
    with pytest.raises(ValueError):
        choose([], 1, 500)


def test_lag_is_the_furthest_online_replica():
    info = {
        "master_repl_offset": 1000,
        "slave0": {"ip": "10.0.0.1", "port": 6379, "state": "online", "offset": 900, "lag": 0},
        "slave1": {"ip": "10.0.0.2", "port": 6379, "state": "online", "offset": 400, "lag": 1},
        "slave2": {"ip": "10.0.0.3", "port": 6379, "state": "wait_bgsave", "offset": 0, "lag": 0},
    }
    assert replica_lag_bytes(info) == 600
    assert replica_lag_bytes({"master_repl_offset": 5}) == 0


def test_sentinel_urls_name_every_sentinel():
    target = sentinel_target("redis://:p%40ss@s-0:26379,s-1:26380,s-2/3")
    assert target.sentinels == [("s-0", 26379), ("s-1", 26380), ("s-2", 26379)]
    assert (target.password, target.db) == ("p@ss", 3)
    assert sentinel_target("redis://s-0:26379").password is None
    with pytest.raises(ValueError):
        sentinel_target("rediss://s-0:26379")
