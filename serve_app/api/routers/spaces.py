"""Memory spaces: a tenant's shared memory, the grants on it, and what is promoted into it."""

from __future__ import annotations

from fastapi import APIRouter, Path, Query
from fastapi.responses import StreamingResponse

from serve_app import schemas
from serve_app.api.params import FactKey, MemoryId, UserId
from serve_app.api.state import Deps, Who
from serve_app.core.spaces import SPACE_PATTERN
from serve_app.core.user_archive import MEDIA_TYPE
from serve_app.services import memories, spaces, user_archive, users
from serve_app.services.audit import audited

router = APIRouter(tags=["memory spaces"])

SpaceId = Path(pattern=SPACE_PATTERN, description="Memory space id.")
Principal = Path(pattern=schemas.PRINCIPAL_PATTERN, description="A key as the audit log names it (`key:<12 hex>`), or `local`.")


@router.post("/v1/spaces", response_model=schemas.SpaceOut, summary="Create a memory space (tenant admin)")
async def create_space(body: schemas.SpaceIn, deps: Deps, who: Who) -> schemas.SpaceOut:
    return await spaces.create_space(deps, who, body)


@router.get("/v1/spaces", response_model=list[schemas.SpaceOut], summary="The spaces this key holds a grant on")
async def list_spaces(deps: Deps, who: Who) -> list[schemas.SpaceOut]:
    return await spaces.list_spaces(deps, who)


@router.get("/v1/spaces/{space_id}", response_model=schemas.SpaceOut, summary="One space")
async def get_space(deps: Deps, who: Who, space_id: str = SpaceId) -> schemas.SpaceOut:
    return await spaces.get_space(deps, who, space_id)


@router.delete("/v1/spaces/{space_id}", response_model=schemas.Deleted, summary="Delete a space and its memory (admin)")
async def delete_space(deps: Deps, who: Who, space_id: str = SpaceId) -> schemas.Deleted:
    return await spaces.delete_space(deps, who, space_id)


@router.get("/v1/spaces/{space_id}/grants", response_model=list[schemas.GrantOut], summary="Who may do what (admin)")
async def list_grants(deps: Deps, who: Who, space_id: str = SpaceId) -> list[schemas.GrantOut]:
    return await spaces.list_grants(deps, who, space_id)


@router.put("/v1/spaces/{space_id}/grants/{principal}", response_model=schemas.GrantOut, summary="Grant a key a role (admin)")
async def put_grant(
    body: schemas.GrantIn, deps: Deps, who: Who, space_id: str = SpaceId, principal: str = Principal
) -> schemas.GrantOut:
    return await spaces.put_grant(deps, who, space_id, principal, body.role)


@router.delete("/v1/spaces/{space_id}/grants/{principal}", response_model=schemas.Deleted, summary="Revoke a grant (admin)")
async def revoke_grant(deps: Deps, who: Who, space_id: str = SpaceId, principal: str = Principal) -> schemas.Deleted:
    return await spaces.revoke_grant(deps, who, space_id, principal)


@router.post("/v1/spaces/{space_id}/memories", response_model=schemas.MemoryOut, summary="Add a memory to a space (write)")
async def add_memory(body: schemas.MemoryIn, deps: Deps, who: Who, space_id: str = SpaceId) -> schemas.MemoryOut:
    return await spaces.add_space_memory(deps, who, space_id, body)


@router.get("/v1/spaces/{space_id}/memories", response_model=list[schemas.MemoryOut], summary="A space's memories (read)")
async def list_memories(
    deps: Deps,
    who: Who,
    space_id: str = SpaceId,
    after: str = Query("", max_length=256, description="Return memories whose id sorts after this (the last id of a page)."),
    limit: int = Query(100, ge=1, le=1000),
) -> list[schemas.MemoryOut]:
    """By id, with each memory's provenance (who wrote it, where a promoted copy came from)."""
    owner = await spaces.require(deps, who, space_id, "read")
    return [memories.memory_out(h) for h in await deps.stores.keywords.page(who.tenant, owner, after=after, limit=limit)]


@router.delete(
    "/v1/spaces/{space_id}/memories/{memory_id}", response_model=schemas.Deleted, summary="Delete a space's memory (write)"
)
async def delete_memory(deps: Deps, who: Who, space_id: str = SpaceId, memory_id: str = MemoryId) -> schemas.Deleted:
    owner = await spaces.require(deps, who, space_id, "write")
    deleting = memories.delete_memory(deps, who.tenant, owner, memory_id)
    return await audited(deps, who, "delete_memory", {"space": space_id, "memory_id": memory_id}, deleting)


@router.post(
    "/v1/spaces/{space_id}/memories/search",
    response_model=list[schemas.SearchHit] | schemas.SearchExplained,
    summary="Search a space (read)",
)
async def search(
    body: schemas.SearchRequest, deps: Deps, who: Who, space_id: str = SpaceId
) -> list[schemas.SearchHit] | schemas.SearchExplained:
    owner = await spaces.require(deps, who, space_id, "read")
    shared = [o for o in await spaces.granted_owners(deps, who, body.spaces) if o != owner]
    return await memories.search_memories(deps, who.tenant, owner, body, shared)


@router.get("/v1/spaces/{space_id}/facts", response_model=list[schemas.FactOut], summary="A space's current facts (read)")
async def list_facts(deps: Deps, who: Who, space_id: str = SpaceId) -> list[schemas.FactOut]:
    owner = await spaces.require(deps, who, space_id, "read")
    return [f.model_copy(update={"space": space_id}) for f in await users.current_facts(deps, who.tenant, owner)]


@router.put("/v1/spaces/{space_id}/facts/{key}", response_model=schemas.FactWrite, summary="Set a space's fact (write)")
async def put_fact(body: schemas.FactIn, deps: Deps, who: Who, space_id: str = SpaceId, key: str = FactKey) -> schemas.FactWrite:
    owner = await spaces.require(deps, who, space_id, "write")
    return await users.put_fact(deps, who.tenant, owner, key, body, added_by=who.actor)


@router.delete("/v1/spaces/{space_id}/facts/{key}", response_model=schemas.Deleted, summary="Close a space's fact (write)")
async def delete_fact(deps: Deps, who: Who, space_id: str = SpaceId, key: str = FactKey) -> schemas.Deleted:
    owner = await spaces.require(deps, who, space_id, "write")
    closing = users.close_fact(deps, who.tenant, owner, key)
    return await audited(deps, who, "close_fact", {"space": space_id, "key": key}, closing)


@router.get("/v1/spaces/{space_id}/facts/{key}/history", response_model=list[schemas.FactOut], summary="Every version (read)")
async def fact_history(deps: Deps, who: Who, space_id: str = SpaceId, key: str = FactKey) -> list[schemas.FactOut]:
    owner = await spaces.require(deps, who, space_id, "read")
    return await users.fact_history(deps, who.tenant, owner, key)


@router.get(
    "/v1/spaces/{space_id}/export",
    response_class=StreamingResponse,
    summary="A space's memory as a portable archive (read)",
    responses={200: {"content": {MEDIA_TYPE: {}}, "description": "JSON Lines (docs/api/archive.md)."}},
)
async def export_space(
    deps: Deps,
    who: Who,
    space_id: str = SpaceId,
    vectors: bool = Query(True, description="Memory lines carry their vectors."),
) -> StreamingResponse:
    """The archive a user's export gives (a space has no sessions of its own): memories with their
    provenance and facts with their history; `POST /v1/users/{uid}/import` takes it."""
    owner = await spaces.require(deps, who, space_id, "read")
    return StreamingResponse(
        user_archive.export_lines(deps, who.tenant, owner, vectors=vectors),
        media_type=MEDIA_TYPE,
        headers={"Content-Disposition": f'attachment; filename="space-{space_id}.memserve.jsonl"'},
    )


@router.post(
    "/v1/users/{user_id}/memories/{memory_id}/promote",
    response_model=schemas.MemoryOut,
    summary="Copy a user's memory into a space (write on the space)",
)
async def promote_memory(
    body: schemas.PromoteIn, deps: Deps, who: Who, user_id: str = UserId, memory_id: str = MemoryId
) -> schemas.MemoryOut:
    return await spaces.promote_memory(deps, who, user_id, memory_id, body)


@router.post(
    "/v1/users/{user_id}/facts/{key}/promote",
    response_model=schemas.FactWrite,
    summary="Make a user's fact a space's (write on the space)",
)
async def promote_fact(
    body: schemas.PromoteIn, deps: Deps, who: Who, user_id: str = UserId, key: str = FactKey
) -> schemas.FactWrite:
    return await spaces.promote_fact(deps, who, user_id, key, body)
