"""Long-term memories: add, list, delete and hybrid search."""

from __future__ import annotations

from fastapi import APIRouter, Query

from serve_app import schemas
from serve_app.api.params import MemoryId, UserId
from serve_app.api.state import Deps, Who
from serve_app.services import memories, spaces
from serve_app.services.audit import audited

router = APIRouter(tags=["memories"])


@router.post("/v1/users/{user_id}/memories", response_model=schemas.MemoryOut, summary="Add a memory directly")
async def add_memory(body: schemas.MemoryIn, deps: Deps, who: Who, user_id: str = UserId) -> schemas.MemoryOut:
    return await memories.add_memory(deps, who.tenant, user_id, body, added_by=who.actor)


@router.get("/v1/users/{user_id}/memories", response_model=list[schemas.MemoryOut], summary="List memories")
async def list_memories(
    deps: Deps,
    who: Who,
    user_id: str = UserId,
    limit: int = Query(100, ge=1, le=1000),
    offset: int = Query(0, ge=0, le=memories.MAX_RESULT_WINDOW - 1, description="offset + limit is at most 16384."),
) -> list[schemas.MemoryOut]:
    return await memories.list_memories(deps, who.tenant, user_id, limit=limit, offset=offset)


@router.delete("/v1/users/{user_id}/memories/{memory_id}", response_model=schemas.Deleted, summary="Delete a memory")
async def delete_memory(deps: Deps, who: Who, user_id: str = UserId, memory_id: str = MemoryId) -> schemas.Deleted:
    deleting = memories.delete_memory(deps, who.tenant, user_id, memory_id)
    return await audited(deps, who, "delete_memory", {"user_id": user_id, "memory_id": memory_id}, deleting)


@router.post(
    "/v1/users/{user_id}/memories/search",
    response_model=list[schemas.SearchHit] | schemas.SearchExplained,
    summary="Hybrid search (dense + BM25 keywords, rank-fused)",
)
async def search(
    body: schemas.SearchRequest, deps: Deps, who: Who, user_id: str = UserId
) -> list[schemas.SearchHit] | schemas.SearchExplained:
    """The hits best first; with `explain`, a SearchExplained: every candidate's scores and why the
    floors kept or dropped it. `spaces`: memory spaces searched too (read grant on each)."""
    shared = await spaces.granted_owners(deps, who, body.spaces)
    return await memories.search_memories(deps, who.tenant, user_id, body, shared)
