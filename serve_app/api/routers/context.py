"""Working memory: the prompt for the agent's next call, inside its token budget."""

from __future__ import annotations

from fastapi import APIRouter

from serve_app import schemas
from serve_app.api.state import Deps, Who
from serve_app.services.context import build_working_memory
from serve_app.services.spaces import granted_owners

router = APIRouter(tags=["context"])


@router.post("/v1/context", response_model=schemas.ContextResponse, summary="Build the prompt for the next call")
async def context(body: schemas.ContextRequestIn, deps: Deps, who: Who) -> schemas.ContextResponse:
    shared = await granted_owners(deps, who, body.spaces)
    return await build_working_memory(deps, who.tenant, body, shared=shared)
