"""How a route reaches its replica's dependencies and its caller: FastAPI dependencies."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from serve_app.core.auth import Caller
from serve_app.core.inspector_auth import COOKIE, CSRF_HEADER
from serve_app.errors import CsrfRejected, Unauthorized
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
    """The tenant comes from the API key (bearer or `X-API-Key`), never from the request body; without
    a key, from the inspector's signed session cookie, whose writes must carry its CSRF token."""
    deps: Dependencies = request.app.state.dependencies
    key = bearer.credentials if bearer else header_key
    if key is None and (caller := inspector_caller(deps, request)) is not None:
        return caller
    if not deps.keyring.enabled:  # the loopback-only local profile
        return Caller(deps.settings.default_tenant, "local", admin=True)
    found = deps.keyring.tenant_for(key)
    if found is None:
        raise Unauthorized()
    return Caller(*found, admin=deps.keyring.is_admin(found[1]))


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def inspector_caller(deps: Dependencies, request: Request) -> Caller | None:
    """The caller of a valid inspector cookie, None without one. A session whose key was removed
    since is over (401); a write without the session's CSRF token is refused (403)."""
    if deps.signer is None or (session := deps.signer.read(request.cookies.get(COOKIE))) is None:
        return None
    tenant = deps.settings.default_tenant if session.key_digest == "local" else deps.keyring.tenant_of_digest(session.key_digest)
    if tenant is None or tenant != session.tenant or (session.key_digest == "local" and deps.keyring.enabled):
        raise Unauthorized("the inspector session's API key is no longer valid: sign in again")
    if request.method not in SAFE_METHODS and not deps.signer.csrf_ok(session, request.headers.get(CSRF_HEADER)):
        raise CsrfRejected()
    admin = session.key_digest == "local" or deps.keyring.is_admin(session.key_digest)
    return Caller(session.tenant, session.key_digest, via="inspector", admin=admin)


Deps = Annotated[Dependencies, Depends(replica_dependencies)]
Who = Annotated[Caller, Depends(authenticated_caller)]
