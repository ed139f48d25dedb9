"""Reading the memorizer's two lanes across their shards: which sessions wait, since when, and how
many (`keys.lane_keys` says what each lane holds)."""

from __future__ import annotations

import heapq

from serve_app.core.clock import now_ms
from serve_app.stores.session_log.connection import SessionLogConnection
from serve_app.stores.session_log.keys import LANE_SHARDS, lane_keys, split_member


def _glob_escape(text: str) -> str:
    """A tenant id as a literal in a Redis MATCH pattern."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


class Lanes(SessionLogConnection):
    """The sessions of the embedding lane and of the LLM lane, oldest or soonest due first."""

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
        return [(*split_member(member), int(score)) for member, score in list(merged)[:limit]]

    async def _oldest(self, lane: int, limit: int, upto: int | None = None) -> list[tuple[str, str]]:
        return [(tenant, session) for tenant, session, _ in await self._oldest_scored(lane, limit, upto)]

    async def pending(self, limit: int = 100) -> list[tuple[str, str]]:
        """Sessions of the embedding lane, the longest waiting first."""
        return await self._oldest(0, limit)

    async def pending_since(self, limit: int = 100) -> list[tuple[str, str, int]]:
        """`pending`, each with its oldest unmemorized turn's arrival (ms)."""
        return await self._oldest_scored(0, limit)

    async def pending_since_ms(self, tenant: str, session: str) -> int | None:
        """When the session's oldest unmemorized turn arrived (its score in the pending set)."""
        score = await self.redis.zscore(self._lanes(tenant, session)[0], self.pending_member(tenant, session))
        return None if score is None else int(score)

    async def llm_due(self, limit: int) -> list[tuple[str, str]]:
        """Sessions of the LLM lane whose pass is due now, longest waiting first."""
        return await self._oldest(1, limit, upto=now_ms())

    async def llm_pending(self, limit: int = 100) -> list[tuple[str, str]]:
        """Sessions of the LLM lane, due or backing off, soonest due first."""
        return await self._oldest(1, limit)

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
