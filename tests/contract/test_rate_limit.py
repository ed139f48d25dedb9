"""The rate limit against a real Redis and a real Redis Cluster, at the boundary of a clock minute."""

from __future__ import annotations

import uuid

import pytest

from serve_app.errors import RateLimited
from serve_app.stores.rate_limit import RateLimiter
from serve_app.stores.redis_client import connect

START = 1_800_000_000.0 + 59.9  # 59.9 s into a clock minute


@pytest.fixture
async def limiter(redis_settings):
    now = [START]
    client = connect(redis_settings["REDIS_URL"], cluster=redis_settings["redis_cluster"])
    yield RateLimiter(client, clock=lambda: now[0]), now
    await client.aclose()


async def test_a_burst_at_the_end_of_a_minute_leaves_no_room_at_the_start_of_the_next(limiter):
    limits, now = limiter
    key = uuid.uuid4().hex
    await limits.spend(key, 10, 10)  # a full minute's worth at hh:mm:59.9
    now[0] += 0.2  # hh:mm+1:00.1: a new clock minute, but the same ten messages are 0.2 s old
    with pytest.raises(RateLimited) as refused:
        await limits.spend(key, 1, 10)
    assert 5 <= refused.value.retry_after_s <= 6  # one message's worth refills in 6 s

    now[0] += 30  # half a minute later, half the allowance is back
    await limits.spend(key, 5, 10)
    with pytest.raises(RateLimited):
        await limits.spend(key, 1, 10)


async def test_no_sixty_second_window_ever_holds_more_than_a_minute_and_a_burst(limiter):
    """Spent as fast as allowed for five minutes: about the limit per minute, never the double."""
    limits, now = limiter
    key = uuid.uuid4().hex
    accepted: list[float] = []
    for _ in range(3000):  # every 0.1 s
        try:
            await limits.spend(key, 1, 60)
            accepted.append(now[0])
        except RateLimited:
            pass
        now[0] += 0.1
    per_window = max(sum(1 for t in accepted if start <= t < start + 60) for start in accepted)
    assert per_window <= 60 + 60 + 1  # a full bucket plus what refills during the window
    late = [t for t in accepted if t >= START + 120]
    assert 175 <= len(late) <= 181  # the steady state is the limit: 60 per minute over the last 180 s
