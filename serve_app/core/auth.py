"""API keys: only their SHA-256 is stored; a key maps to exactly one tenant. Pure: no I/O but reading
the key file at start.

Key file format, one per line (comments with #):  <tenant>:<sha256 hex of the key>
`memserve hash-key` prints such a line for a new key.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from pathlib import Path

from serve_app.core.ids import validate_id


@dataclass(frozen=True)
class Caller:
    """Who is calling: the tenant comes from the API key, never from the request body."""

    tenant: str
    key_digest: str
    via: str = "api"
    """`api`: a key on the request; `inspector`: the inspector's signed-in session cookie."""

    @property
    def actor(self) -> str:
        """Who, for the audit log: a prefix of the key's SHA-256 (enough to tell keys apart, useless
        to anyone without the key), or `local` with keys off."""
        return f"key:{self.key_digest[:12]}" if len(self.key_digest) == 64 else self.key_digest


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> str:
    return "ms_" + secrets.token_urlsafe(32)


class KeyRing:
    """Hashed keys -> tenant. Empty means keys are off (the loopback-only local profile)."""

    def __init__(self, hashed: dict[str, str] | None = None):
        self._tenants: dict[str, str] = {}
        for digest, tenant in (hashed or {}).items():
            digest = digest.strip().lower()
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ValueError("API keys are configured by their SHA-256 hex digest (memserve hash-key)")
            self._tenants[digest] = validate_id(tenant, "tenant")

    @classmethod
    def from_file(cls, path: str | Path) -> KeyRing:
        hashed: dict[str, str] = {}
        for number, raw in enumerate(Path(path).read_text().splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            tenant, sep, digest = line.partition(":")
            if not sep:
                raise ValueError(f"{path}:{number}: expected <tenant>:<sha256 hex>")
            hashed[digest.strip()] = tenant.strip()
        return cls(hashed)

    def merged(self, other: KeyRing) -> KeyRing:
        ring = KeyRing()
        ring._tenants = {**self._tenants, **other._tenants}
        return ring

    @property
    def enabled(self) -> bool:
        return bool(self._tenants)

    def tenant_for(self, key: str | None) -> tuple[str, str] | None:
        """(tenant, key digest) for a valid key, else None. Compares digests in constant time."""
        if not key:
            return None
        digest = hash_key(key)
        for known, tenant in self._tenants.items():
            if hmac.compare_digest(known, digest):
                return tenant, digest
        return None

    def tenant_of_digest(self, digest: str) -> str | None:
        """The tenant of a key known by its digest: a signed-in session ends when its key is removed."""
        for known, tenant in self._tenants.items():
            if hmac.compare_digest(known, digest):
                return tenant
        return None


def is_loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")
