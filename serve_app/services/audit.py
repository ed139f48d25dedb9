"""Destructive calls, and imports, leave an entry in the audit log: who (the key's digest prefix), through what
(API, inspector, MCP), what, when, and what it removed.

Recorded once the action removed something: a call that failed or found nothing removed nothing.
The removal cannot be undone, so an audit write that fails does not turn its success into an
error (the caller would retry, find nothing, and the entry would never be written): it is retried,
then logged whole at ERROR, where log collection keeps it."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable

from tenacity import AsyncRetrying, RetryError, stop_after_attempt, wait_exponential

from serve_app import schemas
from serve_app.core.auth import Caller
from serve_app.services.dependencies import Dependencies

logger = logging.getLogger("ray.serve")
Action = str  # one of schemas.AuditEntry.action
ATTEMPTS = 3


async def audited(
    deps: Dependencies, who: Caller, action: Action, target: dict[str, str], deleting: Awaitable[schemas.Deleted]
) -> schemas.Deleted:
    done = await deleting
    if done.deleted:
        await record(deps, who, action, target, done.details)
    return done


async def record(deps: Dependencies, who: Caller, action: Action, target: dict[str, str], result: dict[str, int]) -> None:
    """Write one entry, retried; an entry that cannot be written is logged whole at ERROR."""
    entry = {"actor": who.actor, "via": who.via, "action": action, "target": target, "result": result}
    try:
        async for attempt in AsyncRetrying(stop=stop_after_attempt(ATTEMPTS), wait=wait_exponential(multiplier=0.1)):
            with attempt:
                await deps.stores.audit.record(who.tenant, **entry)
    except RetryError as exc:
        cause = exc.last_attempt.exception()
        logger.error("audit entry not written (%r): %s", cause, json.dumps({"tenant": who.tenant, **entry}))


async def audit_page(deps: Dependencies, tenant: str, *, before: int | None, limit: int) -> schemas.AuditPage:
    rows = await deps.stores.audit.page(tenant, before=before, limit=limit + 1)
    entries = [schemas.AuditEntry(**row.__dict__) for row in rows[:limit]]
    return schemas.AuditPage(entries=entries, next_before=entries[-1].id if len(rows) > limit else None)
