"""The tenant's audit log and live figures: what the inspector shows, open to any client."""

from __future__ import annotations

from fastapi import APIRouter, Query

from serve_app import schemas
from serve_app.api.state import Deps, Who
from serve_app.services import inspection
from serve_app.services.audit import audit_page

router = APIRouter(tags=["operations"])


@router.get("/v1/audit", response_model=schemas.AuditPage, summary="Destructive calls, newest first")
async def audit(
    deps: Deps,
    who: Who,
    before: int | None = Query(None, ge=1, le=2**62, description="Return entries older than this id (a page's next_before)."),
    limit: int = Query(50, ge=1, le=500),
) -> schemas.AuditPage:
    """Who deleted a memory, closed a fact, deleted a session or forgot a user, when, and what it removed."""
    return await audit_page(deps, who.tenant, before=before, limit=limit)


@router.get("/v1/stats", response_model=schemas.Stats, summary="Live figures of the tenant")
async def stats(deps: Deps, who: Who) -> schemas.Stats:
    """Memorization lag, LLM fallbacks, recall timings (of the replica that answers) and memories stored."""
    return await inspection.stats(deps, who.tenant)
