"""API keys: only their SHA-256 is stored; a key maps to exactly one tenant. Pure: no I/O but reading
the key file at start.

Key file format, one per line (comments with #):  <tenant>:<sha256 hex of the key>[:admin]
`memserve hash-key` prints such a line for a new key. `:admin` makes the key its tenant's admin: it
creates memory spaces and administers every space of the tenant (a tenant's first admin comes from
here; the others are granted through the API).
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
    admin: bool = False
    """The tenant's admin (`:admin` in the key file, or keys off): every space of the tenant is its."""

    @property
    def actor(self) -> str:
        """Who, for the audit log: a prefix of the key's SHA-256 (enough to tell keys apart, useless
        to anyone without the key), or `local` with keys off."""
        return f"key:{self.key_digest[:12]}" if len(self.key_digest) == 64 else self.key_digest


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> str:
    return "ms_" + secrets.token_urlsafe(32)


KEY_ROLES = ("", "admin")


class KeyRing:
    """Hashed keys -> tenant (and the keys that are their tenant's admin). Empty means keys are off
    (the loopback-only local profile)."""

    def __init__(self, hashed: dict[str, str] | None = None, admins: set[str] | None = None):
        self._tenants: dict[str, str] = {}
        self._admins: set[str] = set()
        for digest, tenant in (hashed or {}).items():
            digest = digest.strip().lower()
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ValueError("API keys are configured by their SHA-256 hex digest (memserve hash-key)")
            self._tenants[digest] = validate_id(tenant, "tenant")
        self._admins = {d.strip().lower() for d in admins or ()} & set(self._tenants)

    @classmethod
    def from_file(cls, path: str | Path) -> KeyRing:
        hashed: dict[str, str] = {}
        admins: set[str] = set()
        for number, raw in enumerate(Path(path).read_text().splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            tenant, sep, rest = line.partition(":")
            digest, _, role = rest.partition(":")
            if not sep or role.strip() not in KEY_ROLES:
                raise ValueError(f"{path}:{number}: expected <tenant>:<sha256 hex>[:admin]")
            hashed[digest.strip()] = tenant.strip()
            if role.strip() == "admin":
                admins.add(digest.strip())
        return cls(hashed, admins)

    def merged(self, other: KeyRing) -> KeyRing:
        ring = KeyRing()
        ring._tenants = {**self._tenants, **other._tenants}
        ring._admins = (self._admins - set(other._tenants)) | other._admins
        return ring

    def is_admin(self, digest: str) -> bool:
        """Whether the key of this digest is its tenant's admin."""
        return digest in self._admins

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
