"""Per-key rate limits as fixed one-minute windows in Redis (shared by every ingress replica)."""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from serve_app.errors import RateLimited

_HIT = """
local n = redis.call('INCRBY', KEYS[1], ARGV[1])
if n == tonumber(ARGV[1]) then redis.call('EXPIRE', KEYS[1], 120) end
return n
"""


class RateLimiter:
    def __init__(self, redis: aioredis.Redis):
        self._hit = redis.register_script(_HIT)

    async def spend(self, key_digest: str, amount: int, limit: int) -> int:
        """Count `amount` against this minute's window; raise RateLimited past `limit` (0 = off)."""
        if limit <= 0 or amount <= 0:
            return 0
        now = time.time()
        window = int(now // 60)
        used = int(await self._hit(keys=[f"ms:rl:{key_digest}:{window}"], args=[amount]))
        if used > limit:
            retry_after_s = max(1, 60 - int(now % 60))
            raise RateLimited(f"rate limit of {limit} messages per minute reached; retry in {retry_after_s}s", retry_after_s)
        return used
