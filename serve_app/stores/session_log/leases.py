"""Leases on a session's lane work, so that memorizer replicas do a session's work once."""

from __future__ import annotations

from functools import cached_property

from redis.commands.core import AsyncScript

from serve_app.stores.session_log.connection import SessionLogConnection

# KEYS: the lease. ARGV: the holder, the new time to live (ms); '0' releases it.
_LEASE_KEEP = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '0' then return redis.call('DEL', KEYS[1]) end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"""


class Leases(SessionLogConnection):
    """Take, renew and release a lease on one lane of a session."""

    @cached_property
    def _lease_keep(self) -> AsyncScript:
        return self.redis.register_script(_LEASE_KEEP)

    async def lease(self, tenant: str, session: str, lane: str, holder: str, ttl_ms: int) -> bool:
        """Take the session's lane for `ttl_ms` unless another worker holds it: memorizer replicas
        (and a poke racing the sweep) then do a session's work once instead of side by side."""
        return bool(await self.redis.set(self._lease_key(tenant, session, lane), holder, nx=True, px=ttl_ms))

    async def renew_lease(self, tenant: str, session: str, lane: str, holder: str, ttl_ms: int) -> bool:
        """Extend a lease this holder has; False when it lapsed (another worker may have it now)."""
        return bool(await self._lease_keep(keys=[self._lease_key(tenant, session, lane)], args=[holder, ttl_ms]))

    async def release_lease(self, tenant: str, session: str, lane: str, holder: str) -> None:
        await self._lease_keep(keys=[self._lease_key(tenant, session, lane)], args=[holder, 0])
