"""Moving the keys of the older key layout (one hash tag per session, one zset per lane) to this
one (`keys`), once per Redis."""

from __future__ import annotations

import asyncio
import logging
import re
from functools import cached_property

from redis.commands.core import AsyncScript

from serve_app.stores.session_log.connection import SessionLogConnection
from serve_app.stores.session_log.keys import split_member

LAYOUT_KEY = "ms:layout"
LAYOUT = "2"
"""1: `ms:{tenant/session}:*` keys and one global zset per lane (a single Redis only)."""
_OLD_PENDING_KEY = "ms:pending"
_OLD_LLM_PENDING_KEY = "ms:pending:llm"
_OLD_META = re.compile(r"^ms:\{(?!l\d+\})(?P<member>[^/]+/.+)\}:meta$")

# Layout 1 -> 2 for one session, on a single Redis (every key reachable from one script). KEYS:
# old meta, log, ids, old embedding lane, old LLM lane, new meta, log, ids, new embedding lane, new
# LLM lane, the owner's old session index, its new part. ARGV: lane member, session id. A session
# that already has new keys keeps them and its old ones stay. An old index left empty is gone.
_MIGRATE_SESSION = """
if redis.call('EXISTS', KEYS[6]) == 1 then return 0 end
local listed = redis.call('ZSCORE', KEYS[11], ARGV[2])
if listed then
  redis.call('ZADD', KEYS[12], listed, ARGV[2])
  redis.call('ZREM', KEYS[11], ARGV[2])
  local ttl = redis.call('TTL', KEYS[11])
  if ttl > 0 then redis.call('EXPIRE', KEYS[12], ttl) end
end
for k = 1, 3 do
  if redis.call('EXISTS', KEYS[k]) == 1 then redis.call('RENAME', KEYS[k], KEYS[k + 5]) end
end
for lane = 4, 5 do
  local score = redis.call('ZSCORE', KEYS[lane], ARGV[1])
  if score then
    redis.call('ZADD', KEYS[lane + 5], score, ARGV[1])
    redis.call('ZREM', KEYS[lane], ARGV[1])
  end
end
return 1
"""

logger = logging.getLogger("ray.serve")


class LayoutMigration(SessionLogConnection):
    """Move layout 1's sessions to the lane-sharded layout."""

    @cached_property
    def _migrate_session(self) -> AsyncScript:
        return self.redis.register_script(_MIGRATE_SESSION)

    async def migrate_layout(self) -> int:
        """Move layout 1's keys (`LAYOUT`) to this layout; returns the sessions moved. Idempotent, and
        run by every replica as it connects: the first takes a lock, the others wait for it. Layout 1
        never ran on a cluster (its append script spans slots), so a cluster has nothing to move."""
        if self.cluster or await self.redis.get(LAYOUT_KEY) == LAYOUT:
            return 0
        lock = f"{LAYOUT_KEY}:migrating"
        while not await self.redis.set(lock, "1", nx=True, px=120_000):
            await asyncio.sleep(0.2)
            if await self.redis.get(LAYOUT_KEY) == LAYOUT:
                return 0
        try:
            moved = 0
            async for key in self.redis.scan_iter(match="ms:{*}:meta", count=1000):
                found = _OLD_META.match(key)
                if found is None:
                    continue
                tenant, session = split_member(found["member"])
                old = f"ms:{{{tenant}/{session}}}"
                owner = await self.redis.hget(f"{old}:meta", "user_id") or ""
                keys = [f"{old}:meta", f"{old}:log", f"{old}:ids", _OLD_PENDING_KEY, _OLD_LLM_PENDING_KEY]
                keys += [*self._keys(tenant, session), *self._lanes(tenant, session)]
                keys += [f"ms:{{{tenant}/u/{owner}}}:sessions", self._user_index(tenant, owner, session)]
                moved += int(await self._migrate_session(keys=keys, args=[found["member"], session]))
            await self.redis.set(LAYOUT_KEY, LAYOUT)
            if moved:
                logger.info("session log: moved %d sessions to key layout %s", moved, LAYOUT)
            return moved
        finally:
            await self.redis.delete(lock)
