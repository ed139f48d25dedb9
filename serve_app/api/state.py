"""How a route reaches its replica's dependencies and its caller: FastAPI dependencies."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from serve_app.core.auth import Caller
from serve_app.errors import Unauthorized
from serve_app.services.dependencies import Dependencies

_bearer = HTTPBearer(auto_error=False, description="API key as a bearer token.")
_api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="API key (alternative header).")


# Every dependency here is `async`: FastAPI runs a plain `def` dependency on a worker thread, a
# thread hand-off on every request.


async def replica_dependencies(request: Request) -> Dependencies:
    """Set by `create_http_app` on the app of this replica."""
    return request.app.state.dependencies


async def authenticated_caller(
    request: Request,
    bearer: HTTPAuthorizationCredentials | None = Depends(_bearer),
    header_key: str | None = Depends(_api_key_header),
) -> Caller:
    """The tenant comes from the API key (bearer or `X-API-Key`), never from the request body."""
    deps: Dependencies = request.app.state.dependencies
    if not deps.keyring.enabled:  # the loopback-only local profile
        return Caller(deps.settings.default_tenant, "local")
    found = deps.keyring.tenant_for(bearer.credentials if bearer else header_key)
    if found is None:
        raise Unauthorized()
    return Caller(*found)


Deps = Annotated[Dependencies, Depends(replica_dependencies)]
Who = Annotated[Caller, Depends(authenticated_caller)]
