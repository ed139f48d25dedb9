"""Short-term memory in Redis: an append-only, gapless log per session with a summary checkpoint.

Every multi-key change is one Lua script, so it is atomic on the server: a concurrent append is
never lost, a retried client id is stored once, and a checkpoint is written by compare-and-set.
The list index is the seq (RPUSH returns the new length), so seqs are gapless by construction.

Key layout (Redis Cluster): a script may only touch keys of one slot. The memorizer's two lanes are
therefore sharded (`LANE_SHARDS`), and every key of a session carries its lane shard's hash tag,
so the append that stores a turn also enters the session in the embedding lane and in its user's
session index, atomically, as on a single Redis: the user's index is sharded the same way (one part
per lane shard). The memorizer sweeps the lanes shard by shard; listing a user's sessions reads the
user's parts.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import re
import zlib
from dataclasses import dataclass
from typing import Any

from serve_app.core.clock import now_ms
from serve_app.errors import SessionOwnerError
from serve_app.stores.confirmed_writes import ConfirmedWrites, ConfirmObserver
from serve_app.stores.redis_client import AnyRedis, connect

# KEYS: meta, log, ids, the embedding lane, the user's session index (all of the session's slot).
# ARGV: user, ttl (s), now (ms), lane member, message count, then (client id, message) per message,
# then the session id.
_APPEND = """
local owner = redis.call('HGET', KEYS[1], 'user_id')
if owner and owner ~= ARGV[1] then return {-1, owner} end
if not owner then
  redis.call('HSET', KEYS[1], 'user_id', ARGV[1], 'created_at', ARGV[3], 'covers_upto_seq', 0,
             'memorized_upto_seq', 0, 'extracted_upto_seq', 0, 'version', 0)
end
local out = {1}
local added = 0
local n = tonumber(ARGV[5])
for i = 0, n - 1 do
  local mid = ARGV[6 + 2 * i]
  local existing = false
  if mid ~= '' then existing = redis.call('HGET', KEYS[3], mid) end
  if existing then
    out[#out + 1] = -tonumber(existing)
  else
    local seq = redis.call('RPUSH', KEYS[2], ARGV[7 + 2 * i])
    if mid ~= '' then redis.call('HSET', KEYS[3], mid, seq) end
    out[#out + 1] = seq
    added = added + 1
  end
end
redis.call('HSET', KEYS[1], 'updated_at', ARGV[3])
if added > 0 then redis.call('ZADD', KEYS[4], 'NX', ARGV[3], ARGV[4]) end
redis.call('ZADD', KEYS[5], ARGV[3], ARGV[6 + 2 * n])
local ttl = tonumber(ARGV[2])
for _, k in ipairs({1, 2, 3, 5}) do redis.call('EXPIRE', KEYS[k], ttl) end
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

# KEYS: meta, log, ids, the embedding lane, the LLM lane, the owner's session index. ARGV: lane
# member, session id. Returns the keys deleted.
_DELETE = """
local removed = redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[2])
return removed
"""

# KEYS: the lease. ARGV: the holder, the new time to live (ms); '0' releases it.
_LEASE_KEEP = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '0' then return redis.call('DEL', KEYS[1]) end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"""

LANE_SHARDS = 64
"""Shards of each lane. Part of the key layout: a session's keys carry its shard's hash tag, so
changing it moves every session (a migration, like `migrate_layout`). 64 slots spread sessions
within one shard of even over up to about twenty cluster masters, and keep a sweep (every
`memorizer_sweep_interval_s`) at a few hundred small commands, one round trip per node."""
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


def lane_shard(member: str) -> int:
    """The lane shard of a session (`tenant/session`): stable across processes and versions."""
    return zlib.crc32(member.encode()) % LANE_SHARDS


def lane_keys(shard: int) -> tuple[str, str]:
    """The embedding lane and the LLM lane of one shard.
    The embedding lane: sessions with turns not yet memorized, scored by the oldest one's arrival.
    The LLM lane: sessions owed extraction, an LLM summary or its redo, scored by when they are due;
    apart from the embedding lane, so that an LLM outage never holds up embedding."""
    return f"ms:{{l{shard}}}:pending", f"ms:{{l{shard}}}:pending:llm"


def _member(raw: str) -> tuple[str, str]:
    tenant, session = raw.split("/", 1)
    return tenant, session


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
    """Async Redis client for session logs, checkpoints, cursors and the two lanes.
    `cluster`: the URL names one node of a Redis Cluster (redis-py has no URL scheme for it);
    `sentinel_master`: the URL names the Sentinels watching that primary.

    Durability: a write whose loss would move a session backwards is acknowledged only once
    `confirm_replicas` replicas confirmed it (within `confirm_timeout_ms`, else `ReplicasUnconfirmed`,
    a 503): appends, checkpoints, cursors, session deletes and tombstones. Leases, lane back-off and
    counters are not: losing one repeats idempotent work. Call `start` first."""

    def __init__(
        self,
        url: str,
        ttl_s: int,
        *,
        cluster: bool = False,
        sentinel_master: str = "",
        confirm_replicas: int = 0,
        confirm_timeout_ms: int = 1000,
        observer: ConfirmObserver | None = None,
    ):
        self.cluster = cluster
        self.redis: AnyRedis = connect(url, cluster=cluster, sentinel_master=sentinel_master)
        self.ttl_s = ttl_s
        self.writes = ConfirmedWrites(self.redis, confirm_replicas, confirm_timeout_ms, observer)
        self._append = self.redis.register_script(_APPEND)
        self._cas = self.redis.register_script(_CHECKPOINT_CAS)
        self._advance = self.redis.register_script(_ADVANCE_CURSOR)
        self._llm_done = self.redis.register_script(_LLM_PASS_DONE)
        self._lease_keep = self.redis.register_script(_LEASE_KEEP)
        self._migrate_session = self.redis.register_script(_MIGRATE_SESSION)
        self._delete = self.redis.register_script(_DELETE)

    async def start(self) -> None:
        """Check the replica setting against the primaries (refusing one they cannot meet) and log
        which confirmation runs."""
        logger.info("session log: %s", await self.writes.start())

    async def replica_lag(self) -> dict[str, int]:
        """Each primary's furthest-behind replica, in bytes (also sent to the observer)."""
        return await self.writes.replica_lag()

    async def close(self) -> None:
        await self.redis.aclose()

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    @staticmethod
    def _base(tenant: str, session: str) -> str:
        # The lane shard's hash tag: the session's keys and its lane entries share one slot.
        member = f"{tenant}/{session}"
        return f"ms:{{l{lane_shard(member)}}}:s:{member}"

    def _keys(self, tenant: str, session: str) -> tuple[str, str, str]:
        base = self._base(tenant, session)
        return f"{base}:meta", f"{base}:log", f"{base}:ids"

    def _lanes(self, tenant: str, session: str) -> tuple[str, str]:
        return lane_keys(lane_shard(self.pending_member(tenant, session)))

    @staticmethod
    def user_index_key(tenant: str, user: str, shard: int) -> str:
        """One part of the user's session index: the sessions of one lane shard, in its slot."""
        return f"ms:{{l{shard}}}:u:{tenant}/{user}:sessions"

    def _user_index(self, tenant: str, user: str, session: str) -> str:
        return self.user_index_key(tenant, user, lane_shard(self.pending_member(tenant, session)))

    @staticmethod
    def pending_member(tenant: str, session: str) -> str:
        return f"{tenant}/{session}"

    async def append(self, tenant: str, session: str, user: str, messages: list[dict[str, Any]]) -> AppendResult:
        """Append messages atomically; a message whose client id was seen returns its first seq.
        Confirmed by replicas: a lost append gives its seqs to other messages after a failover. If
        the confirmation times out the turns may be stored already; a retry with the same ids finds them."""
        meta, log, ids = self._keys(tenant, session)
        args: list[Any] = [user, self.ttl_s, now_ms(), self.pending_member(tenant, session), len(messages)]
        for message in messages:
            args += [message.get("id") or "", json.dumps(message, ensure_ascii=False, separators=(",", ":"))]
        keys = [meta, log, ids, self._lanes(tenant, session)[0], self._user_index(tenant, user, session)]
        out = await self.writes.script(self._append, keys, [*args, session])
        if int(out[0]) == -1:
            raise SessionOwnerError(str(out[1]))
        raw = [int(x) for x in out[1:]]
        return AppendResult(seqs=[abs(x) for x in raw], duplicates=[x < 0 for x in raw])

    async def seqs_of(self, tenant: str, session: str, client_ids: list[str]) -> list[int | None]:
        """The seq each client id was stored at, None where it was not (a retry asks what its first
        attempt left)."""
        if not client_ids:
            return []
        _, _, ids_key = self._keys(tenant, session)
        found = await self.redis.hmget(ids_key, client_ids)
        return [int(seq) if seq is not None else None for seq in found]

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
        """Compare-and-set the summary checkpoint; None when another writer got there first.
        Confirmed by replicas: a lost checkpoint hands its version number out again, so a compactor
        that read the lost one could win a compare-and-set against a summary it never saw."""
        meta_key, log_key, _ = self._keys(tenant, session)
        args = [expected_version, summary, covers_upto_seq, "1" if degraded else "0", json.dumps(state or {})]
        out = int(await self.writes.script(self._cas, [meta_key, log_key], args))
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
        leaves the embedding lane and, if `owes_llm`, joins the LLM lane (due now).
        Confirmed by replicas: a cursor moved back after a failover redoes extraction, which can
        assert again a fact a later turn superseded."""
        if cursor not in ("memorized_upto_seq", "extracted_upto_seq"):
            raise ValueError(cursor)
        meta_key, log_key, _ = self._keys(tenant, session)
        member = self.pending_member(tenant, session)
        args = [upto_seq, member, "1" if done else "0", cursor, "1" if owes_llm else "0", now_ms()]
        keys = [meta_key, log_key, *self._lanes(tenant, session)]
        return int(await self.writes.script(self._advance, keys, args))

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

    async def _oldest_scored(self, lane: int, limit: int, upto: int | None = None) -> list[tuple[str, str, int]]:
        """The `limit` lowest-scored sessions of one lane (0 embedding, 1 LLM) over all its shards,
        at most `upto`, with their scores: each shard's first `limit`, merged (one pipeline, a
        round trip per node)."""
        if limit <= 0:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for shard in range(LANE_SHARDS):
                key = lane_keys(shard)[lane]
                pipe.zrangebyscore(key, "-inf", "+inf" if upto is None else upto, start=0, num=limit, withscores=True)
            shards = await pipe.execute()
        merged = heapq.merge(*shards, key=lambda entry: entry[1])
        return [(*_member(member), int(score)) for member, score in list(merged)[:limit]]

    async def _oldest(self, lane: int, limit: int, upto: int | None = None) -> list[tuple[str, str]]:
        return [(tenant, session) for tenant, session, _ in await self._oldest_scored(lane, limit, upto)]

    async def llm_due(self, limit: int) -> list[tuple[str, str]]:
        """Sessions of the LLM lane whose pass is due now, longest waiting first."""
        return await self._oldest(1, limit, upto=now_ms())

    async def llm_pass_done(self, tenant: str, session: str, *, seen_len: int, ok: bool, retry_ms: int) -> int:
        """Record an LLM pass over the log as it was at `seen_len` turns; returns the retry delay (ms)
        after a failure, 0 otherwise."""
        meta_key, log_key, _ = self._keys(tenant, session)
        args = [self.pending_member(tenant, session), seen_len, "1" if ok else "0", retry_ms, now_ms()]
        return int(await self._llm_done(keys=[meta_key, log_key, self._lanes(tenant, session)[1]], args=args))

    async def lane_sizes(self) -> tuple[int, int]:
        """Sessions in the embedding lane and in the LLM lane."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for shard in range(LANE_SHARDS):
                for key in lane_keys(shard):
                    pipe.zcard(key)
            sizes = [int(n) for n in await pipe.execute()]
        return sum(sizes[0::2]), sum(sizes[1::2])

    async def tenant_lanes(self, tenant: str) -> tuple[int, int | None, int]:
        """The tenant's sessions in the embedding lane, the oldest one's first unmemorized append (ms),
        and its sessions in the LLM lane. The lanes are shared by all tenants: ZSCAN walks them in
        steps, so a long backlog of other tenants neither hides this one's nor blocks Redis."""
        match = f"{_glob_escape(tenant)}/*"
        keys = [key for shard in range(LANE_SHARDS) for key in lane_keys(shard)]
        async with self.redis.pipeline(transaction=False) as pipe:  # every shard's first step at once
            for key in keys:
                pipe.zscan(key, 0, match=match, count=1000)
            steps = await pipe.execute()
        found: list[list[int]] = []
        for key, (cursor, entries) in zip(keys, steps, strict=True):
            scores = [int(score) for _, score in entries]
            while int(cursor):  # a long shard: the rest of its steps
                cursor, entries = await self.redis.zscan(key, cursor, match=match, count=1000)
                scores += [int(score) for _, score in entries]
            found.append(scores)
        firsts = [score for shard in found[0::2] for score in shard]
        llm = sum(len(shard) for shard in found[1::2])
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
        """Sessions of the LLM lane, due or backing off, soonest due first."""
        return await self._oldest(1, limit)

    @staticmethod
    def tombstone_key(tenant: str, user: str) -> str:
        return f"ms:{{{tenant}/u/{user}}}:forgotten"

    async def set_tombstone(self, tenant: str, user: str, keep_s: int = 30 * 24 * 3600) -> int:
        """Mark the user forgotten now; sessions created up to now must never be memorized again.
        Confirmed by replicas: a lost tombstone lets an erased user's sessions be memorized again."""
        stamp = now_ms()
        key = self.tombstone_key(tenant, user)
        await self.writes.command(key, "SET", key, stamp, "EX", max(keep_s, self.ttl_s))
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
        score = await self.redis.zscore(self._lanes(tenant, session)[0], self.pending_member(tenant, session))
        return None if score is None else int(score)

    async def pending(self, limit: int = 100) -> list[tuple[str, str]]:
        """Sessions of the embedding lane, the longest waiting first."""
        return await self._oldest(0, limit)

    async def pending_since(self, limit: int = 100) -> list[tuple[str, str, int]]:
        """`pending`, each with its oldest unmemorized turn's arrival (ms)."""
        return await self._oldest_scored(0, limit)

    async def user_sessions(self, tenant: str, user: str) -> list[tuple[str, int]]:
        """The user's live sessions, newest activity first (every part of the index in one pipeline);
        expired sessions are pruned on read."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for shard in range(LANE_SHARDS):
                pipe.zrange(self.user_index_key(tenant, user, shard), 0, -1, withscores=True)
            parts = await pipe.execute()
        entries = sorted((entry for part in parts for entry in part), key=lambda entry: -entry[1])
        alive = []
        for session, score in entries:
            if await self.redis.exists(self._keys(tenant, session)[0]):
                alive.append((session, int(score)))
            else:
                await self.redis.zrem(self._user_index(tenant, user, session), session)
        return alive

    async def forget_user_sessions(self, tenant: str, user: str) -> None:
        """Drop the user's session index (the sessions themselves are deleted one by one). Not confirmed
        by replicas: an index entry that comes back names a deleted session, which a read prunes."""
        async with self.redis.pipeline(transaction=False) as pipe:  # one key per command: any slot
            for shard in range(LANE_SHARDS):
                pipe.delete(self.user_index_key(tenant, user, shard))
            await pipe.execute()

    async def delete(self, tenant: str, session: str) -> bool:
        """Delete the session's log and its lane entries in one script (one slot: atomic on a cluster
        too). Confirmed by replicas: a lost delete brings back a session its user deleted."""
        meta_key, log_key, ids_key = self._keys(tenant, session)
        owner = await self.redis.hget(meta_key, "user_id") or ""
        keys = [meta_key, log_key, ids_key, *self._lanes(tenant, session), self._user_index(tenant, owner, session)]
        removed = await self.writes.script(self._delete, keys, [self.pending_member(tenant, session), session])
        return bool(int(removed))

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
                tenant, session = _member(found["member"])
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
