"""Users: their sessions, their structured facts with history, and forgetting them."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from serve_app import schemas
from serve_app.api.params import FactKey, UserId
from serve_app.api.state import Deps, Who
from serve_app.core.user_archive import MEDIA_TYPE
from serve_app.services import inspection, sessions, user_archive, users
from serve_app.services.audit import audited

router = APIRouter(tags=["users and facts"])


@router.get("/v1/users", response_model=schemas.UsersPage, summary="The tenant's users, by id")
async def list_users(
    deps: Deps,
    who: Who,
    after: str = Query(
        "",
        pattern=r"^(|[A-Za-z0-9][A-Za-z0-9._@-]{0,127})$",
        description="Return users whose id sorts after this (a page's next_after).",
    ),
    limit: int = Query(50, ge=1, le=500),
) -> schemas.UsersPage:
    """Users with a long-term memory or a current fact, with their counts."""
    return await inspection.list_users(deps, who.tenant, after=after, limit=limit)


@router.get("/v1/users/{user_id}/sessions", response_model=schemas.UserSessions, summary="A user's live sessions")
async def user_sessions(deps: Deps, who: Who, user_id: str = UserId) -> schemas.UserSessions:
    return await sessions.user_sessions(deps, who.tenant, user_id)


@router.delete("/v1/users/{user_id}", response_model=schemas.Deleted, summary="Forget a user everywhere")
async def forget(deps: Deps, who: Who, user_id: str = UserId) -> schemas.Deleted:
    """Sessions, vectors and facts (with their history) of the user, in every store; a tombstone
    stops a memorizer that is still working on the user from writing anything back."""
    return await audited(deps, who, "forget_user", {"user_id": user_id}, users.forget(deps, who.tenant, user_id))


@router.get("/v1/users/{user_id}/facts", response_model=list[schemas.FactOut], summary="Current facts")
async def list_facts(deps: Deps, who: Who, user_id: str = UserId) -> list[schemas.FactOut]:
    return await users.current_facts(deps, who.tenant, user_id)


@router.get("/v1/users/{user_id}/facts/{key}", response_model=schemas.FactOut, summary="One current fact")
async def get_fact(deps: Deps, who: Who, user_id: str = UserId, key: str = FactKey) -> schemas.FactOut:
    return await users.get_fact(deps, who.tenant, user_id, key)


@router.put("/v1/users/{user_id}/facts/{key}", response_model=schemas.FactWrite, summary="Set a fact (supersedes)")
async def put_fact(body: schemas.FactIn, deps: Deps, who: Who, user_id: str = UserId, key: str = FactKey) -> schemas.FactWrite:
    return await users.put_fact(deps, who.tenant, user_id, key, body, added_by=who.actor)


@router.delete("/v1/users/{user_id}/facts/{key}", response_model=schemas.Deleted, summary="Close a fact")
async def delete_fact(deps: Deps, who: Who, user_id: str = UserId, key: str = FactKey) -> schemas.Deleted:
    closing = users.close_fact(deps, who.tenant, user_id, key)
    return await audited(deps, who, "close_fact", {"user_id": user_id, "key": key}, closing)


@router.get("/v1/users/{user_id}/facts/{key}/history", response_model=list[schemas.FactOut], summary="Every version")
async def fact_history(deps: Deps, who: Who, user_id: str = UserId, key: str = FactKey) -> list[schemas.FactOut]:
    return await users.fact_history(deps, who.tenant, user_id, key)


@router.get(
    "/v1/users/{user_id}/export",
    response_class=StreamingResponse,
    summary="The user's memory as a portable archive",
    responses={200: {"content": {MEDIA_TYPE: {}}, "description": "JSON Lines (docs/api/archive.md)."}},
)
async def export_user(
    deps: Deps,
    who: Who,
    user_id: str = UserId,
    vectors: bool = Query(True, description="Memory lines carry their vectors (an import under the same model takes them)."),
) -> StreamingResponse:
    """Sessions with their logs and checkpoints, memories with their dates and origin, facts with
    their whole history, and the embedding model, as JSON Lines ending in an `end` line."""
    return StreamingResponse(
        user_archive.export_lines(deps, who.tenant, user_id, vectors=vectors),
        media_type=MEDIA_TYPE,
        headers={"Content-Disposition": f'attachment; filename="{user_id}.memserve.jsonl"'},
    )


@router.post(
    "/v1/users/{user_id}/import",
    response_model=schemas.ImportReport,
    summary="Take an archive into this user",
    openapi_extra={"requestBody": {"required": True, "content": {MEDIA_TYPE: {"schema": {"type": "string"}}}}},
)
async def import_user(request: Request, deps: Deps, who: Who, user_id: str = UserId) -> schemas.ImportReport:
    """Idempotent: importing twice changes nothing, and an import a failure cut short is finished by
    importing again. The archive is checked whole first: a bad one writes nothing."""
    return await user_archive.import_lines(deps, who, user_id, (await request.body()).splitlines())
