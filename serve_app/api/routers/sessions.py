"""Short-term memory: a session's ordered log, its summary checkpoint and compaction."""

from __future__ import annotations

from fastapi import APIRouter, Query

from serve_app import schemas
from serve_app.api.params import SessionId
from serve_app.api.state import Deps, Who
from serve_app.services import inspection, sessions
from serve_app.services.audit import audited

router = APIRouter(tags=["sessions"])


@router.post("/v1/sessions/{session_id}/messages", response_model=schemas.AppendResponse, summary="Append messages")
async def append(body: schemas.AppendRequest, deps: Deps, who: Who, session_id: str = SessionId) -> schemas.AppendResponse:
    return await sessions.append_messages(deps, who, session_id, body)


@router.get("/v1/sessions/{session_id}", response_model=schemas.SessionInfo, summary="Session state")
async def session_info(deps: Deps, who: Who, session_id: str = SessionId) -> schemas.SessionInfo:
    return await sessions.describe_session(deps, who.tenant, session_id)


@router.get("/v1/sessions/{session_id}/messages", response_model=schemas.MessagesPage, summary="Read the log")
async def messages(
    deps: Deps,
    who: Who,
    session_id: str = SessionId,
    after: int = Query(0, ge=0, le=2**53, description="Return messages with seq > after."),
    limit: int = Query(100, ge=1, le=1000),
) -> schemas.MessagesPage:
    return await sessions.read_page(deps, who.tenant, session_id, after=after, limit=limit)


@router.delete("/v1/sessions/{session_id}", response_model=schemas.Deleted, summary="Delete a session and its vectors")
async def delete_session(deps: Deps, who: Who, session_id: str = SessionId) -> schemas.Deleted:
    deleting = sessions.delete_session(deps, who.tenant, session_id)
    return await audited(deps, who, "delete_session", {"session_id": session_id}, deleting)


@router.get("/v1/sessions/{session_id}/export", response_model=schemas.SessionExport, summary="The session whole, as JSON")
async def export(deps: Deps, who: Who, session_id: str = SessionId) -> schemas.SessionExport:
    """Its state, summary checkpoint, every message and the memories made from it."""
    return await inspection.export_session(deps, who.tenant, session_id)


@router.post("/v1/sessions/{session_id}/compress", response_model=schemas.CompressResponse, summary="Compact now")
async def compress(deps: Deps, who: Who, session_id: str = SessionId) -> schemas.CompressResponse:
    """Runs in the memorizer, which owns the summarizer (and its LLM, when one is configured)."""
    return await sessions.compress_session(deps, who.tenant, session_id)
