"""Per-key rate limits in Redis, shared by every ingress replica: a token bucket (GCRA).

Each key may send up to `limit` messages at once, and the allowance refills continuously at `limit`
per minute. Unlike counting per clock minute, a burst at the end of one minute leaves no room at the
start of the next: the bucket is empty until it refills. One value per key (the theoretical arrival
time of the next message), updated by one script, so concurrent replicas never overspend.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from serve_app.errors import RateLimited
from serve_app.runtime.tracing import traced_store
from serve_app.stores.redis_client import AnyRedis

# KEYS: the key's arrival time. ARGV: now (ms), messages, limit per minute.
# Returns 0 when allowed, else the milliseconds until the request would fit.
_SPEND = """
local now, amount, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local interval = 60000 / limit
local tat = math.max(tonumber(redis.call('GET', KEYS[1]) or '0'), now)
local new_tat = tat + amount * interval
local wait = new_tat - 60000 - now
if wait > 0 then return math.ceil(wait) end
redis.call('SET', KEYS[1], tostring(new_tat), 'PX', math.ceil(new_tat - now) + 1000)
return 0
"""


@traced_store("redis")
class RateLimiter:
    def __init__(self, redis: AnyRedis, clock: Callable[[], float] = time.time):
        self._spend = redis.register_script(_SPEND)
        self._clock = clock

    async def spend(self, key_digest: str, amount: int, limit: int) -> None:
        """Take `amount` messages from the key's allowance; raise RateLimited when it has not that
        many (nothing is taken then). `limit` is messages per minute; 0 = no limit."""
        if limit <= 0 or amount <= 0:
            return
        if amount > limit:
            raise RateLimited(f"{amount} messages in one request exceed the rate limit of {limit} per minute", 60)
        wait_ms = int(await self._spend(keys=[f"ms:rl:{key_digest}"], args=[int(self._clock() * 1000), amount, limit]))
        if wait_ms > 0:
            retry_after_s = max(1, math.ceil(wait_ms / 1000))
            raise RateLimited(f"rate limit of {limit} messages per minute reached; retry in {retry_after_s}s", retry_after_s)
