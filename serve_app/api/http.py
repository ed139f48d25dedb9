"""The HTTP API v1 as one FastAPI app per ingress replica: routers, error responses, body limit."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from serve_app.api.body_limit import BodySizeLimit
from serve_app.api.error_responses import install_error_handlers
from serve_app.api.host_guard import HostGuard
from serve_app.api.inspector.router import router as inspector_router
from serve_app.api.mcp_tools import build_mcp, mcp_routes
from serve_app.api.routers import chat, context, health, memories, operations, sessions, spaces, users
from serve_app.core.hosts import HostPolicy
from serve_app.runtime import tracing
from serve_app.services.dependencies import Dependencies

ROUTERS = (
    spaces.router,
    health.router,
    sessions.router,
    context.router,
    users.router,
    memories.router,
    chat.router,
    operations.router,
    inspector_router,
)


def _telemetry() -> dict[str, Any]:
    """FastAPI's own server span of each request (outside every middleware, `traceparent` of the
    caller honoured) is the root of the replica's spans; the memory operation's span and the stores'
    hang below it. Its per-step spans (dependencies, endpoint, serialization) would only split the
    request's own time into thirds: off. A FastAPI older than 0.162 has no `telemetry` (vLLM's
    environments pin one): there the memory operation's span is the root (docs/operations/tracing.md)."""
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    return {
        "telemetry": {
            "tracing": tracing.enabled(),
            "tracer_provider": tracing.provider(),
            "operation_spans": False,
            "metrics": False,  # the replica's metrics are Ray's (Prometheus); the same histograms twice cost twice
            "logs": False,
        }
    }


def create_http_app(deps: Dependencies) -> FastAPI:
    """The app of one replica: its routes reach `deps` through `request.app.state`; the MCP tools at
    `/mcp` are the same service functions, served by the MCP SDK's session manager, which runs for
    the app's lifetime."""
    mcp = build_mcp(deps)
    mcp_endpoint = mcp_routes(mcp, deps)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with mcp.session_manager.run():
            yield

    app = FastAPI(
        title="agent-memory-serve",
        version="1.0.0",
        description="Working, short-term and long-term memory for LLM agents, on Ray Serve.",
        lifespan=lifespan,
        **_telemetry(),
    )
    app.state.dependencies = deps
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, limit=deps.settings.max_body_bytes, import_limit=deps.settings.max_import_bytes)
    if not deps.keyring.enabled:  # outermost: a refused host's request is not even read
        app.add_middleware(HostGuard, policy=HostPolicy(deps.settings.allowed_hosts))
    for router in ROUTERS:
        app.include_router(router)
    app.router.routes.extend(mcp_endpoint)
    return app
