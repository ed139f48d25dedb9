"""A session's log: the append-only, gapless list of its turns, its meta, and its deletion.

The list index is the seq (RPUSH returns the new length), so seqs are gapless by construction; the
append is one Lua script, so a concurrent append is never lost and a retried client id is stored
once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from redis.commands.core import AsyncScript

from serve_app.core.clock import now_ms
from serve_app.errors import SessionOwnerError
from serve_app.stores.session_log.connection import SessionLogConnection

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

# KEYS: meta, log, ids, the embedding lane, the LLM lane, the owner's session index. ARGV: lane
# member, session id. Returns the keys deleted.
_DELETE = """
local removed = redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[2])
return removed
"""

# KEYS: meta, log. ARGV: the last seq to read, -1 for the newest. Returns {} for no session, else
# {meta as HGETALL's pairs, the log's length, the turns after the summary's cover up to that seq}.
_UNCOVERED = """
local data = redis.call('HGETALL', KEYS[1])
if #data == 0 then return {} end
local covers = 0
for i = 1, #data, 2 do
  if data[i] == 'covers_upto_seq' then covers = tonumber(data[i + 1]) end
end
local count = redis.call('LLEN', KEYS[2])
local upto = tonumber(ARGV[1])
if upto >= 0 and upto <= covers then return {data, count, {}} end
return {data, count, redis.call('LRANGE', KEYS[2], covers, upto >= 0 and upto - 1 or -1)}
"""


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
    remembered_upto_seq: int = 0
    """The checkpointed turns the session's summary memories cover (services/memorizer.py)."""


class SessionTurns(SessionLogConnection):
    """Append, read and delete a session's turns."""

    @cached_property
    def _append(self) -> AsyncScript:
        return self.redis.register_script(_APPEND)

    @cached_property
    def _delete(self) -> AsyncScript:
        return self.redis.register_script(_DELETE)

    @cached_property
    def _uncovered(self) -> AsyncScript:
        return self.redis.register_script(_UNCOVERED)

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
        return _session_meta(data, int(count)) if data else None

    async def uncovered(
        self, tenant: str, session: str, upto: int | None = None
    ) -> tuple[SessionMeta | None, list[dict[str, Any]]]:
        """The session's meta and its turns after the summary's cover (up to seq `upto`, else all),
        read at one instant in one round trip: the prompt's recent turns are exactly those the
        summary it shows does not cover, whatever a compaction does meanwhile."""
        meta_key, log_key, _ = self._keys(tenant, session)
        out = await self._uncovered(keys=[meta_key, log_key], args=[-1 if upto is None else upto])
        if not out:
            return None, []
        pairs, count, raw = out
        meta = _session_meta(dict(zip(pairs[::2], pairs[1::2], strict=True)), int(count))
        return meta, _turns(raw, after=meta.covers_upto_seq)

    async def read(self, tenant: str, session: str, after: int = 0, limit: int = -1) -> list[dict[str, Any]]:
        """Messages with seq > after (at most `limit`, -1 for all), each with its seq."""
        _, log_key, _ = self._keys(tenant, session)
        stop = -1 if limit < 0 else after + limit - 1
        return _turns(await self.redis.lrange(log_key, after, stop), after=after)

    async def delete(self, tenant: str, session: str) -> bool:
        """Delete the session's log and its lane entries in one script (one slot: atomic on a cluster
        too). Confirmed by replicas: a lost delete brings back a session its user deleted."""
        meta_key, log_key, ids_key = self._keys(tenant, session)
        owner = await self.redis.hget(meta_key, "user_id") or ""
        keys = [meta_key, log_key, ids_key, *self._lanes(tenant, session), self._user_index(tenant, owner, session)]
        removed = await self.writes.script(self._delete, keys, [self.pending_member(tenant, session), session])
        return bool(int(removed))


def _turns(raw: list[str], *, after: int) -> list[dict[str, Any]]:
    """Stored turns read from seq `after` + 1 on, each with its seq (its place in the list)."""
    return [json.loads(item) | {"seq": after + i + 1} for i, item in enumerate(raw)]


def _session_meta(data: dict[str, str], count: int) -> SessionMeta:
    state = data.get("summary_state")
    return SessionMeta(
        user_id=data["user_id"],
        message_count=count,
        covers_upto_seq=int(data.get("covers_upto_seq", 0)),
        memorized_upto_seq=int(data.get("memorized_upto_seq", 0)),
        extracted_upto_seq=int(data.get("extracted_upto_seq", 0)),
        version=int(data.get("version", 0)),
        summary=data.get("summary", ""),
        summary_degraded=data.get("summary_degraded") == "1",
        summary_state=json.loads(state) if state else None,
        created_at_ms=int(data.get("created_at", 0)),
        updated_at_ms=int(data.get("updated_at", 0)),
        remembered_upto_seq=int(data.get("remembered_upto_seq", 0)),
    )
