"""What an operator asks of a tenant (the inspector asks it through the API): its users, live
figures, and a session whole, to keep or to attach to a bug report."""

from __future__ import annotations

import time

from serve_app import schemas
from serve_app.core.timings import RecentTimings
from serve_app.services.dependencies import Dependencies
from serve_app.services.memories import memory_out
from serve_app.services.sessions import describe_session

EXPORT_MAX_MEMORIES = 100_000


async def list_users(deps: Dependencies, tenant: str, *, after: str, limit: int) -> schemas.UsersPage:
    """Users with a long-term memory or a current fact, by id. A user whose first turns are not
    memorized yet (within a sweep) appears once they are."""
    rows = await deps.stores.keywords.list_users(tenant, after=after, limit=limit + 1)
    users = [schemas.UserSummary(user_id=u, memories=m, facts=f) for u, m, f in rows[:limit]]
    return schemas.UsersPage(users=users, next_after=users[-1].user_id if len(rows) > limit else None)


async def stats(deps: Dependencies, tenant: str) -> schemas.Stats:
    stores = deps.stores
    pending, oldest_ms, llm_due = await stores.log.tenant_lanes(tenant)
    counters = await stores.log.counters(tenant)
    timings = deps.recall_timings.get(tenant, RecentTimings())
    return schemas.Stats(
        memories=await stores.keywords.count(tenant),
        memorization=schemas.MemorizationStats(
            sessions_pending=pending,
            oldest_pending_s=None if oldest_ms is None else round(max(0.0, time.time() - oldest_ms / 1000), 3),
            llm_sessions_due=llm_due,
        ),
        llm=schemas.LLMStats(
            mode=deps.settings.llm_mode,
            summary_fallbacks=counters.get("summary_fallbacks", 0),
            extraction_failures=counters.get("extraction_failures", 0),
        ),
        recall=schemas.RecallStats(samples=len(timings), p50_ms=timings.percentile(50), p95_ms=timings.percentile(95)),
    )


async def export_session(deps: Dependencies, tenant: str, session_id: str) -> schemas.SessionExport:
    """The log whole, the summary checkpoint and the memories made from the session."""
    info = await describe_session(deps, tenant, session_id)
    meta = await deps.stores.log.meta(tenant, session_id)
    rows = await deps.stores.log.read(tenant, session_id)
    memories = await deps.stores.keywords.session_memories(tenant, info.user_id, session_id, limit=EXPORT_MAX_MEMORIES)
    return schemas.SessionExport(
        session=info,
        summary=meta.summary if meta is not None else "",
        messages=[schemas.StoredMessage(**r) for r in rows],
        memories=[memory_out(h) for h in memories],
    )
