"""Destructive calls leave an entry in the audit log: who (the key's digest prefix), through what
(API, inspector, MCP), what, when, and what it removed. Recorded once the action succeeded: a
call that failed removed nothing, and a retry of it is recorded when it succeeds."""

from __future__ import annotations

from collections.abc import Awaitable

from serve_app import schemas
from serve_app.core.auth import Caller
from serve_app.services.dependencies import Dependencies

Action = str  # one of schemas.AuditEntry.action


async def audited(
    deps: Dependencies, who: Caller, action: Action, target: dict[str, str], deleting: Awaitable[schemas.Deleted]
) -> schemas.Deleted:
    done = await deleting
    await deps.stores.audit.record(who.tenant, actor=who.actor, via=who.via, action=action, target=target, result=done.details)
    return done


async def audit_page(deps: Dependencies, tenant: str, *, before: int | None, limit: int) -> schemas.AuditPage:
    rows = await deps.stores.audit.page(tenant, before=before, limit=limit + 1)
    entries = [schemas.AuditEntry(**row.__dict__) for row in rows[:limit]]
    return schemas.AuditPage(entries=entries, next_before=entries[-1].id if len(rows) > limit else None)
