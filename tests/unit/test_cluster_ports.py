"""A Redis Cluster node's port and its bus port (port + 10000) both lie below the kernel's ephemeral
range: a bus port inside it can be taken by any outgoing connection between the choice and the
node's start, and the node then exits with "address already in use"."""

from __future__ import annotations

from serve_app.embedded.ports import ephemeral_low
from serve_app.embedded.redis_cluster import BUS_OFFSET, cluster_node_port


def test_a_node_and_its_bus_port_lie_below_the_ephemeral_range():
    low = ephemeral_low()
    taken: set[int] = set()
    for _ in range(50):
        port = cluster_node_port(taken)
        taken.add(port)
        assert 1024 <= port and port + BUS_OFFSET < low, (port, low)
