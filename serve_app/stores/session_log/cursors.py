"""How far the memorizer has come with a session: the cursors in its meta, and the moves in and out
of the two lanes that go with them (one script each, so a session never leaves a lane with work left)."""

from __future__ import annotations

from functools import cached_property

from redis.commands.core import AsyncScript

from serve_app.core.clock import now_ms
from serve_app.stores.session_log.connection import SessionLogConnection

# KEYS: meta, log, the embedding lane, the LLM lane. ARGV: new cursor value, lane member, done
# flag, cursor field, '1' if the session then owes the LLM lane a pass, now (ms).
_ADVANCE_CURSOR = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('ZREM', KEYS[3], ARGV[2])
  redis.call('ZREM', KEYS[4], ARGV[2])
  return -2
end
local field = ARGV[4]
local cur = tonumber(redis.call('HGET', KEYS[1], field) or '0')
local new = tonumber(ARGV[1])
if new > cur then
  redis.call('HSET', KEYS[1], field, new)
  if field == 'extracted_upto_seq' then redis.call('HDEL', KEYS[1], 'extraction_failures') end
  cur = new
end
if ARGV[3] == '1' and tonumber(redis.call('HGET', KEYS[1], 'memorized_upto_seq') or '0') >= redis.call('LLEN', KEYS[2]) then
  redis.call('ZREM', KEYS[3], ARGV[2])
  if ARGV[5] == '1' then redis.call('ZADD', KEYS[4], 'NX', ARGV[6], ARGV[2]) end
end
return cur
"""

# KEYS: meta, log, the LLM lane. ARGV: lane member, the log length the pass started from, '1' if
# it succeeded, the retry delay (ms) if not, now (ms). A session leaves the lane only when nothing
# arrived since the pass began and its summary is not degraded; a failed pass comes back after the
# delay, doubled per failure (kept in the meta, so every replica backs off alike).
_LLM_PASS_DONE = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('ZREM', KEYS[3], ARGV[1])
  return 0
end
if ARGV[3] == '1' then
  redis.call('HDEL', KEYS[1], 'llm_failures')
  if redis.call('LLEN', KEYS[2]) <= tonumber(ARGV[2]) and redis.call('HGET', KEYS[1], 'summary_degraded') ~= '1' then
    redis.call('ZREM', KEYS[3], ARGV[1])
    return 0
  end
  redis.call('ZADD', KEYS[3], 'XX', ARGV[5], ARGV[1])
  return 0
end
local failures = redis.call('HINCRBY', KEYS[1], 'llm_failures', 1)
local delay = math.min(tonumber(ARGV[4]) * 2 ^ (failures - 1), 60000)
redis.call('ZADD', KEYS[3], 'XX', tonumber(ARGV[5]) + delay, ARGV[1])
return delay
"""


class Cursors(SessionLogConnection):
    """Move a session's cursors forward and record its LLM passes."""

    @cached_property
    def _advance(self) -> AsyncScript:
        return self.redis.register_script(_ADVANCE_CURSOR)

    @cached_property
    def _llm_done(self) -> AsyncScript:
        return self.redis.register_script(_LLM_PASS_DONE)

    async def advance_cursor(
        self,
        tenant: str,
        session: str,
        upto_seq: int,
        *,
        done: bool,
        cursor: str = "memorized_upto_seq",
        owes_llm: bool = False,
    ) -> int:
        """Move a cursor forward (never back). When `done` and every turn is memorized, the session
        leaves the embedding lane and, if `owes_llm`, joins the LLM lane (due now).
        Confirmed by replicas: a cursor moved back after a failover redoes extraction, which can
        assert again a fact a later turn superseded."""
        if cursor not in ("memorized_upto_seq", "extracted_upto_seq", "remembered_upto_seq"):
            raise ValueError(cursor)
        meta_key, log_key, _ = self._keys(tenant, session)
        member = self.pending_member(tenant, session)
        args = [upto_seq, member, "1" if done else "0", cursor, "1" if owes_llm else "0", now_ms()]
        keys = [meta_key, log_key, *self._lanes(tenant, session)]
        return int(await self.writes.script(self._advance, keys, args))

    async def llm_pass_done(self, tenant: str, session: str, *, seen_len: int, ok: bool, retry_ms: int) -> int:
        """Record an LLM pass over the log as it was at `seen_len` turns; returns the retry delay (ms)
        after a failure, 0 otherwise."""
        meta_key, log_key, _ = self._keys(tenant, session)
        args = [self.pending_member(tenant, session), seen_len, "1" if ok else "0", retry_ms, now_ms()]
        return int(await self._llm_done(keys=[meta_key, log_key, self._lanes(tenant, session)[1]], args=args))

    async def count_extraction_failure(self, tenant: str, session: str) -> int:
        """Invalid extraction outputs for the span after the extraction cursor (reset when it moves)."""
        meta_key, _, _ = self._keys(tenant, session)
        return int(await self.redis.hincrby(meta_key, "extraction_failures", 1))
