"""Which host names a keyless service answers to: loopback ones, plus those the operator names.

With API keys off, nothing but the network keeps strangers out, and a browser is a way in: a page
whose name an attacker re-resolves to 127.0.0.1 (DNS rebinding) is same-origin with the service
and reads what it likes. Its requests still carry the attacker's name in Host, so the name decides.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
"""Names no outside DNS answer can stand for: IP literals and the name every resolver keeps local."""


def host_name(host: str) -> str:
    """The name of a Host header or a setting: no port, no IPv6 brackets, lowercase, no final dot."""
    host = host.strip().lower()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


class HostPolicy:
    """The names requests may address (Host) and the sites whose pages may call (Origin)."""

    def __init__(self, extra: Iterable[str] = ()):
        self.names = tuple(dict.fromkeys([*LOOPBACK_NAMES, *(host_name(name) for name in extra if name.strip())]))
        self._names = frozenset(self.names)

    def allows_host(self, host: str | None) -> bool:
        return bool(host) and host_name(host) in self._names

    def allows_origin(self, origin: str | None) -> bool:
        """A request without Origin comes from no page (or the service's own): allowed. `null` (a
        sandboxed frame, a file) names no site this service trusts."""
        if origin is None:
            return True
        try:
            name = urlsplit(origin.strip()).hostname
        except ValueError:
            return False
        return name is not None and host_name(name) in self._names

    def mcp_hosts(self) -> list[str]:
        """The same names in the MCP SDK's form, which compares Host values: exact, or `name:*` for any port."""
        return [value for host in self._as_hosts() for value in (host, f"{host}:*")]

    def mcp_origins(self) -> list[str]:
        return [f"{scheme}://{host}{port}" for host in self._as_hosts() for scheme in ("http", "https") for port in ("", ":*")]

    def _as_hosts(self) -> list[str]:
        return [f"[{name}]" if ":" in name else name for name in self.names]
