"""services/quota.py on the real stores: a tenant's stored memories are counted in the keyword
index, and a write that would go past its quota is refused with QuotaExceeded (429) before it
stores anything; deleting makes room again, and another tenant's quota is its own."""

from __future__ import annotations

import pytest

from serve_app.errors import QuotaExceeded
from serve_app.schemas import AppendRequest, MemoryIn, MessageIn
from serve_app.services.memories import add_memory, delete_memory
from serve_app.services.quota import check_memory_quota
from serve_app.services.sessions import append_messages
from tests.services.seed import new_id


async def test_a_write_past_the_quota_is_refused_with_nothing_stored_until_a_delete_makes_room(make_deps, caller):
    tenant, user, session = caller.tenant, new_id("user"), new_id("session")
    deps = make_deps(quota_memories=100, quota_overrides={tenant: 2})
    first = await add_memory(deps, tenant, user, MemoryIn(text="Allergic to penicillin."))
    await add_memory(deps, tenant, user, MemoryIn(text="Blood type O negative."))

    with pytest.raises(QuotaExceeded) as refused:
        await add_memory(deps, tenant, user, MemoryIn(text="Takes vitamin D in winter."))
    assert refused.value.status_code == 429 and refused.value.retry_after_s == QuotaExceeded.RETRY_AFTER_S
    assert refused.value.detail.startswith("quota of 2 stored memories reached (2 stored)")
    assert await deps.stores.keywords.count(tenant) == 2
    with pytest.raises(QuotaExceeded):  # an append is counted against the same quota, before it is stored
        await append_messages(deps, caller, session, AppendRequest(user_id=user, messages=[MessageIn(role="user", content="hi")]))
    assert await deps.stores.log.meta(tenant, session) is None

    await check_memory_quota(deps, new_id("tenant"), 100)  # another tenant: the default quota, its own count
    await delete_memory(deps, tenant, user, first.id)
    await add_memory(deps, tenant, user, MemoryIn(text="Takes vitamin D in winter."))
    assert await deps.stores.keywords.count(tenant) == 2


async def test_a_quota_of_zero_is_none(make_deps, caller):
    deps = make_deps(quota_memories=0)
    user = new_id("user")
    for text in ("Likes jazz.", "Plays the cello."):
        await add_memory(deps, caller.tenant, user, MemoryIn(text=text))
    await check_memory_quota(deps, caller.tenant, 10_000)
    assert await deps.stores.keywords.count(caller.tenant) == 2
