"""What the session log keeps per user: the index of the user's sessions (one part per lane shard)
and the tombstone of a user who was forgotten."""

from __future__ import annotations

from serve_app.core.clock import now_ms
from serve_app.stores.session_log.connection import SessionLogConnection
from serve_app.stores.session_log.keys import LANE_SHARDS


class UserSessions(SessionLogConnection):
    """List and forget a user's sessions; mark a user forgotten."""

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
