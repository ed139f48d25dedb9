"""What the chat endpoint remembers of its calls, in Redis: each retry-capable call (one that
carries an `Idempotency-Key`, or the openai SDK's retry counter) by its key, and each conversation
without a session id by the history it will resend.

A call's record is written before its turns are stored, so a retry finds the call whatever point
its first attempt reached, and stores nothing twice (the turns' ids come from the call).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from serve_app.runtime.tracing import traced_store
from serve_app.stores.redis_client import AnyRedis


@dataclass(frozen=True)
class CallRecord:
    call: str
    """The call's id, from which its turns' and its answer's client ids derive."""
    session: str
    body: str
    """A digest of the request, so an Idempotency-Key sent again with another body is refused."""
    new_turns: int
    """How many of the request's last turns the call stored."""


@traced_store("redis")
class ChatCalls:
    def __init__(self, redis: AnyRedis, ttl_s: int):
        self.redis = redis
        self.ttl_s = ttl_s

    @staticmethod
    def _call_key(tenant: str, user: str, key: str) -> str:
        return f"ms:chat:{{{tenant}/{user}}}:call:{key}"

    @staticmethod
    def _conversation_key(tenant: str, user: str, digest: str) -> str:
        return f"ms:chat:{{{tenant}/{user}}}:conv:{digest}"

    async def find(self, tenant: str, user: str, key: str) -> CallRecord | None:
        raw = await self.redis.get(self._call_key(tenant, user, key))
        return CallRecord(**json.loads(raw)) if raw else None

    async def claim(self, tenant: str, user: str, key: str, record: CallRecord, *, first_only: bool) -> CallRecord | None:
        """Keep `record` under `key`. `first_only` (an Idempotency-Key): only if the key is new, and
        the record already kept is returned instead; else the newest call of that key wins (the SDK's
        retries follow the call they repeat)."""
        raw = json.dumps(asdict(record))
        redis_key = self._call_key(tenant, user, key)
        if not first_only:
            await self.redis.set(redis_key, raw, ex=self.ttl_s)
            return None
        if await self.redis.set(redis_key, raw, ex=self.ttl_s, nx=True):
            return None
        return await self.find(tenant, user, key)

    async def conversation(self, tenant: str, user: str, digest: str) -> str | None:
        """The session whose last stored answer ends the history with this digest."""
        return await self.redis.get(self._conversation_key(tenant, user, digest))

    async def remember_conversation(self, tenant: str, user: str, digest: str, session: str, ttl_s: int) -> None:
        await self.redis.set(self._conversation_key(tenant, user, digest), session, ex=ttl_s)
