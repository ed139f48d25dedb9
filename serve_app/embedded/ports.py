"""Ports on this machine for the embedded servers: free ones to give them, and whether one answers."""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def free_listen_port(host: str = "0.0.0.0", below: int | None = None) -> int:
    """A port free now and outside the kernel's ephemeral range, for a server that binds it later:
    a port from the ephemeral range (what binding port 0 gives) can be taken meanwhile by any
    outgoing connection of this machine, and the server then fails with "address already in use".
    `below`: a lower bound still (a Redis Cluster node's bus port must stay out of that range too)."""
    low = ephemeral_low() if below is None else min(below, ephemeral_low())
    for _ in range(200):
        port = random.randint(max(1024, low // 2), low - 1)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    return free_port()


def ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def port_open(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0
