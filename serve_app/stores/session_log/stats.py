"""Per-tenant counters that every memorizer replica adds to."""

from __future__ import annotations

from serve_app.stores.session_log.connection import SessionLogConnection


class Stats(SessionLogConnection):
    """A tenant's shared counters."""

    async def count(self, tenant: str, counts: dict[str, int]) -> None:
        """Add to the tenant's shared counters (what every memorizer replica saw)."""
        counts = {name: n for name, n in counts.items() if n}
        if not counts:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for name, n in counts.items():
                pipe.hincrby(self.stats_key(tenant), name, n)
            await pipe.execute()

    async def counters(self, tenant: str) -> dict[str, int]:
        return {name: int(n) for name, n in (await self.redis.hgetall(self.stats_key(tenant))).items()}
