"""Liveness of the service and its stores."""

from __future__ import annotations

from fastapi import APIRouter, Response

from serve_app import schemas
from serve_app.api.state import Deps
from serve_app.services import health

router = APIRouter(tags=["health"])


@router.get("/v1/ping", response_model=schemas.Pong, summary="No-op: the latency floor of this ingress")
async def ping() -> schemas.Pong:
    """Touches no store: the cost of the proxy, the replica and FastAPI alone (bench/load.py's floor)."""
    return schemas.Pong()


@router.get(
    "/healthz",
    response_model=schemas.Health,
    summary="Status of each backing store",
    responses={503: {"model": schemas.Health, "description": "A backing store is down."}},
)
async def healthz(response: Response, deps: Deps) -> schemas.Health:
    status = await health.check(deps)
    if status.status != "ok":
        response.status_code = 503
    return status
