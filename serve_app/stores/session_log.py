"""Short-term memory in Redis: an append-only, gapless log per session with a summary checkpoint.

Every multi-key change is one Lua script, so it is atomic on the server: a concurrent append is
never lost, a retried client id is stored once, and a checkpoint is written by compare-and-set.
The list index is the seq (RPUSH returns the new length), so seqs are gapless by construction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from serve_app.core.clock import now_ms
from serve_app.errors import SessionOwnerError

_APPEND = """
local owner = redis.call('HGET', KEYS[1], 'user_id')
if owner and owner ~= ARGV[1] then return {-1, owner} end
if not owner then
  redis.call('HSET', KEYS[1], 'user_id', ARGV[1], 'created_at', ARGV[3], 'covers_upto_seq', 0,
             'memorized_upto_seq', 0, 'extracted_upto_seq', 0, 'version', 0)
end
local out = {1}
local added = 0
local n = tonumber(ARGV[6])
for i = 0, n - 1 do
  local mid = ARGV[7 + 2 * i]
  local existing = false
  if mid ~= '' then existing = redis.call('HGET', KEYS[3], mid) end
  if existing then
    out[#out + 1] = -tonumber(existing)
  else
    local seq = redis.call('RPUSH', KEYS[2], ARGV[8 + 2 * i])
    if mid ~= '' then redis.call('HSET', KEYS[3], mid, seq) end
    out[#out + 1] = seq
    added = added + 1
  end
end
redis.call('HSET', KEYS[1], 'updated_at', ARGV[3])
if added > 0 then redis.call('ZADD', KEYS[5], 'NX', ARGV[3], ARGV[4]) end
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[5])
local ttl = tonumber(ARGV[2])
for k = 1, 4 do redis.call('EXPIRE', KEYS[k], ttl) end
return out
"""

_CHECKPOINT_CAS = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -2 end
local version = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if version ~= tonumber(ARGV[1]) then return -1 end
local covers = tonumber(redis.call('HGET', KEYS[1], 'covers_upto_seq') or '0')
if tonumber(ARGV[3]) < covers or tonumber(ARGV[3]) > redis.call('LLEN', KEYS[2]) then return -1 end
redis.call('HSET', KEYS[1], 'summary', ARGV[2], 'covers_upto_seq', ARGV[3], 'summary_degraded', ARGV[4],
           'summary_state', ARGV[5], 'version', version + 1)
return version + 1
"""

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

# KEYS: the lease. ARGV: the holder, the new time to live (ms); '0' releases it.
_LEASE_KEEP = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '0' then return redis.call('DEL', KEYS[1]) end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"""

PENDING_KEY = "ms:pending"
"""The embedding lane: sessions with turns not yet memorized, scored by the oldest one's arrival."""
LLM_PENDING_KEY = "ms:pending:llm"
"""The LLM lane: sessions owed extraction, an LLM summary or its redo, scored by when they are due.
Apart from the embedding lane, so that an LLM outage never holds up embedding."""


@dataclass
class AppendResult:
    seqs: list[int]
    duplicates: list[bool]


@dataclass
class SessionMeta:
    user_id: str
    message_count: int
    covers_upto_seq: int
    memorized_upto_seq: int
    extracted_upto_seq: int
    version: int
    summary: str
    summary_degraded: bool
    summary_state: dict[str, Any] | None
    created_at_ms: int
    updated_at_ms: int


def _glob_escape(text: str) -> str:
    """A tenant id as a literal in a Redis MATCH pattern."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


class SessionLog:
    """Async Redis client for session logs, checkpoints, cursors and the pending set."""

    def __init__(self, url: str, ttl_s: int):
        self.redis = aioredis.from_url(url, decode_responses=True, health_check_interval=30)
        self.ttl_s = ttl_s
        self._append = self.redis.register_script(_APPEND)
        self._cas = self.redis.register_script(_CHECKPOINT_CAS)
        self._advance = self.redis.register_script(_ADVANCE_CURSOR)
        self._llm_done = self.redis.register_script(_LLM_PASS_DONE)
        self._lease_keep = self.redis.register_script(_LEASE_KEEP)

    async def close(self) -> None:
        await self.redis.aclose()

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    @staticmethod
    def _base(tenant: str, session: str) -> str:
        # One hash tag per session keeps its keys in one slot for Redis Cluster.
        return f"ms:{{{tenant}/{session}}}"

    def _keys(self, tenant: str, session: str) -> tuple[str, str, str]:
        base = self._base(tenant, session)
        return f"{base}:meta", f"{base}:log", f"{base}:ids"

    @staticmethod
    def user_sessions_key(tenant: str, user: str) -> str:
        return f"ms:{{{tenant}/u/{user}}}:sessions"

    @staticmethod
    def pending_member(tenant: str, session: str) -> str:
        return f"{tenant}/{session}"

    async def append(self, tenant: str, session: str, user: str, messages: list[dict[str, Any]]) -> AppendResult:
        """Append messages atomically; a message whose client id was seen returns its first seq."""
        meta, log, ids = self._keys(tenant, session)
        args: list[Any] = [user, self.ttl_s, now_ms(), self.pending_member(tenant, session), session, len(messages)]
        for message in messages:
            args += [message.get("id") or "", json.dumps(message, ensure_ascii=False, separators=(",", ":"))]
        keys = [meta, log, ids, self.user_sessions_key(tenant, user), PENDING_KEY]
        out = await self._append(keys=keys, args=args)
        if int(out[0]) == -1:
            raise SessionOwnerError(str(out[1]))
        raw = [int(x) for x in out[1:]]
        return AppendResult(seqs=[abs(x) for x in raw], duplicates=[x < 0 for x in raw])

    async def meta(self, tenant: str, session: str) -> SessionMeta | None:
        meta_key, log_key, _ = self._keys(tenant, session)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(meta_key)
            pipe.llen(log_key)
            data, count = await pipe.execute()
        if not data:
            return None
        state = data.get("summary_state")
        return SessionMeta(
            user_id=data["user_id"],
            message_count=int(count),
            covers_upto_seq=int(data.get("covers_upto_seq", 0)),
            memorized_upto_seq=int(data.get("memorized_upto_seq", 0)),
            extracted_upto_seq=int(data.get("extracted_upto_seq", 0)),
            version=int(data.get("version", 0)),
            summary=data.get("summary", ""),
            summary_degraded=data.get("summary_degraded") == "1",
            summary_state=json.loads(state) if state else None,
            created_at_ms=int(data.get("created_at", 0)),
            updated_at_ms=int(data.get("updated_at", 0)),
        )

    async def read(self, tenant: str, session: str, after: int = 0, limit: int = -1) -> list[dict[str, Any]]:
        """Messages with seq > after (at most `limit`, -1 for all), each with its seq."""
        _, log_key, _ = self._keys(tenant, session)
        stop = -1 if limit < 0 else after + limit - 1
        raw = await self.redis.lrange(log_key, after, stop)
        return [json.loads(item) | {"seq": after + i + 1} for i, item in enumerate(raw)]

    async def write_checkpoint(
        self,
        tenant: str,
        session: str,
        *,
        expected_version: int,
        summary: str,
        covers_upto_seq: int,
        degraded: bool,
        state: dict[str, Any] | None,
    ) -> int | None:
        """Compare-and-set the summary checkpoint; None when another writer got there first."""
        meta_key, log_key, _ = self._keys(tenant, session)
        args = [expected_version, summary, covers_upto_seq, "1" if degraded else "0", json.dumps(state or {})]
        out = int(await self._cas(keys=[meta_key, log_key], args=args))
        return out if out >= 0 else None

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
        leaves the embedding lane and, if `owes_llm`, joins the LLM lane (due now)."""
        if cursor not in ("memorized_upto_seq", "extracted_upto_seq"):
            raise ValueError(cursor)
        meta_key, log_key, _ = self._keys(tenant, session)
        member = self.pending_member(tenant, session)
        args = [upto_seq, member, "1" if done else "0", cursor, "1" if owes_llm else "0", now_ms()]
        return int(await self._advance(keys=[meta_key, log_key, PENDING_KEY, LLM_PENDING_KEY], args=args))

    def _lease_key(self, tenant: str, session: str, lane: str) -> str:
        return f"{self._base(tenant, session)}:lease:{lane}"

    async def lease(self, tenant: str, session: str, lane: str, holder: str, ttl_ms: int) -> bool:
        """Take the session's lane for `ttl_ms` unless another worker holds it: memorizer replicas
        (and a poke racing the sweep) then do a session's work once instead of side by side."""
        return bool(await self.redis.set(self._lease_key(tenant, session, lane), holder, nx=True, px=ttl_ms))

    async def renew_lease(self, tenant: str, session: str, lane: str, holder: str, ttl_ms: int) -> bool:
        """Extend a lease this holder has; False when it lapsed (another worker may have it now)."""
        return bool(await self._lease_keep(keys=[self._lease_key(tenant, session, lane)], args=[holder, ttl_ms]))

    async def release_lease(self, tenant: str, session: str, lane: str, holder: str) -> None:
        await self._lease_keep(keys=[self._lease_key(tenant, session, lane)], args=[holder, 0])

    async def llm_due(self, limit: int) -> list[tuple[str, str]]:
        """Sessions of the LLM lane whose pass is due now, longest waiting first."""
        members = await self.redis.zrangebyscore(LLM_PENDING_KEY, "-inf", now_ms(), start=0, num=limit)
        return [tuple(m.split("/", 1)) for m in members]  # type: ignore[misc]

    async def llm_pass_done(self, tenant: str, session: str, *, seen_len: int, ok: bool, retry_ms: int) -> int:
        """Record an LLM pass over the log as it was at `seen_len` turns; returns the retry delay (ms)
        after a failure, 0 otherwise."""
        meta_key, log_key, _ = self._keys(tenant, session)
        args = [self.pending_member(tenant, session), seen_len, "1" if ok else "0", retry_ms, now_ms()]
        return int(await self._llm_done(keys=[meta_key, log_key, LLM_PENDING_KEY], args=args))

    async def lane_sizes(self) -> tuple[int, int]:
        """Sessions in the embedding lane and in the LLM lane."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zcard(PENDING_KEY)
            pipe.zcard(LLM_PENDING_KEY)
            embedding, llm = await pipe.execute()
        return int(embedding), int(llm)

    async def tenant_lanes(self, tenant: str) -> tuple[int, int | None, int]:
        """The tenant's sessions in the embedding lane, the oldest one's first unmemorized append (ms),
        and its sessions in the LLM lane. The lanes are shared by all tenants: ZSCAN walks them in
        steps, so a long backlog of other tenants neither hides this one's nor blocks Redis."""
        match = f"{_glob_escape(tenant)}/*"
        firsts = [int(score) async for _, score in self.redis.zscan_iter(PENDING_KEY, match=match, count=1000)]
        llm = sum([1 async for _ in self.redis.zscan_iter(LLM_PENDING_KEY, match=match, count=1000)])
        return len(firsts), min(firsts, default=None), llm

    @staticmethod
    def stats_key(tenant: str) -> str:
        return f"ms:{{{tenant}}}:stats"

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

    async def llm_pending(self, limit: int = 100) -> list[tuple[str, str]]:
        """Every session of the LLM lane, due or backing off."""
        members = await self.redis.zrange(LLM_PENDING_KEY, 0, limit - 1)
        return [tuple(m.split("/", 1)) for m in members]  # type: ignore[misc]

    @staticmethod
    def tombstone_key(tenant: str, user: str) -> str:
        return f"ms:{{{tenant}/u/{user}}}:forgotten"

    async def set_tombstone(self, tenant: str, user: str, keep_s: int = 30 * 24 * 3600) -> int:
        """Mark the user forgotten now; sessions created up to now must never be memorized again."""
        stamp = now_ms()
        await self.redis.set(self.tombstone_key(tenant, user), stamp, ex=max(keep_s, self.ttl_s))
        return stamp

    async def forgotten(self, tenant: str, user: str, created_at_ms: int) -> bool:
        """True when the user was forgotten after this session began (it belongs to the erased past)."""
        stamp = await self.redis.get(self.tombstone_key(tenant, user))
        return stamp is not None and created_at_ms <= int(stamp)

    async def count_extraction_failure(self, tenant: str, session: str) -> int:
        """Invalid extraction outputs for the span after the extraction cursor (reset when it moves)."""
        meta_key, _, _ = self._keys(tenant, session)
        return int(await self.redis.hincrby(meta_key, "extraction_failures", 1))

    async def pending_since_ms(self, tenant: str, session: str) -> int | None:
        """When the session's oldest unmemorized turn arrived (its score in the pending set)."""
        score = await self.redis.zscore(PENDING_KEY, self.pending_member(tenant, session))
        return None if score is None else int(score)

    async def pending(self, limit: int = 100) -> list[tuple[str, str]]:
        members = await self.redis.zrange(PENDING_KEY, 0, limit - 1)
        return [tuple(m.split("/", 1)) for m in members]  # type: ignore[misc]

    async def user_sessions(self, tenant: str, user: str) -> list[tuple[str, int]]:
        """The user's live sessions, newest activity first; expired sessions are pruned on read."""
        key = self.user_sessions_key(tenant, user)
        entries = await self.redis.zrevrange(key, 0, -1, withscores=True)
        alive = []
        for session, score in entries:
            if await self.redis.exists(self._keys(tenant, session)[0]):
                alive.append((session, int(score)))
            else:
                await self.redis.zrem(key, session)
        return alive

    async def forget_user_sessions(self, tenant: str, user: str) -> None:
        """Drop the user's session index (the sessions themselves are deleted one by one)."""
        await self.redis.delete(self.user_sessions_key(tenant, user))

    async def delete(self, tenant: str, session: str) -> bool:
        meta_key, log_key, ids_key = self._keys(tenant, session)
        owner = await self.redis.hget(meta_key, "user_id")
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(meta_key, log_key, ids_key)
            pipe.zrem(PENDING_KEY, self.pending_member(tenant, session))
            pipe.zrem(LLM_PENDING_KEY, self.pending_member(tenant, session))
            if owner:
                pipe.zrem(self.user_sessions_key(tenant, owner), session)
            removed = (await pipe.execute())[0]
        return bool(removed)
