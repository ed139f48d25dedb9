"""The one mapping from exceptions to error responses, for every route and the middleware.

Service errors carry their status and message (`serve_app.errors`); a store that cannot be
reached becomes a 503 with `Retry-After`; FastAPI's own 422 keeps its shape, with the echo of the
bad input made encodable. Handlers are `async`: Starlette runs a plain `def` handler on a worker
thread, a thread hand-off per error response.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import socket
from typing import Any

import asyncpg
import redis.exceptions
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pymilvus.exceptions import MilvusException
from starlette.exceptions import HTTPException
from starlette.types import Scope

from serve_app.errors import InvalidRequest, ServiceError, Unavailable
from serve_app.stores.redis_client import closed_connection

logger = logging.getLogger("ray.serve")

# What the store clients raise when their server is unreachable or too slow to answer.
BACKEND_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    # A Redis Cluster moving: a failover under way, a slot migrating, a write sent to a replica that
    # was just demoted, redirects followed until the client gave up. The same request succeeds later.
    redis.exceptions.ClusterError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.AskError,
    redis.exceptions.SlotNotCoveredError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    # A pooled connection whose server died mid-exchange: asyncpg waits on it for a sync that will
    # never come and refuses the next statement before sending it; the connection is dropped once
    # its socket is seen closed (SQLAlchemy treats this error as a disconnect too).
    asyncpg.InternalClientError,
    MilvusException,
    ConnectionError,
    asyncio.TimeoutError,
    OSError,
)
# An OSError is a store out of reach only with a network errno (or a failed name lookup): a file
# error is a fault of this service, a 500, not "retry later".
NETWORK_ERRNOS = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ENETDOWN,
        errno.ETIMEDOUT,
        errno.EPIPE,
        errno.EADDRNOTAVAIL,
    }
)


def backend_unreachable(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and not isinstance(exc, ConnectionError | TimeoutError | socket.gaierror):
        # asyncio reports a failed connect to several addresses as one OSError without an errno.
        return exc.errno in NETWORK_ERRNOS or (exc.errno is None and str(exc).startswith("Multiple exceptions"))
    return isinstance(exc, BACKEND_ERRORS) or closed_connection(exc)


def _echoable(value: Any) -> Any:
    """`value` in a form that JSON-encodes: lone surrogates escaped, NaN and Infinity as strings."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {_echoable(k): _echoable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_echoable(v) for v in value]
    return value


class RoutingError(ServiceError):
    """Starlette's own refusals (no such path, a method the route does not take) as a service
    error, so they take the shape of their path like every other error; `Allow` stays."""

    def __init__(self, exc: HTTPException):
        super().__init__(exc.detail)
        self.status_code = exc.status_code
        self.routing_headers = dict(exc.headers or {})

    def headers(self) -> dict[str, str]:
        return {**super().headers(), **self.routing_headers}


def as_service_error(exc: BaseException) -> ServiceError:
    """The service error an exception answers as."""
    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, HTTPException):
        return RoutingError(exc)
    if isinstance(exc, RequestValidationError):
        # A lone surrogate or a NaN sent by the client would otherwise turn the 422 into a 500.
        return InvalidRequest(_echoable(jsonable_encoder(exc.errors())))
    if backend_unreachable(exc):
        logger.warning("backend unavailable: %r", exc)
        return Unavailable(type(exc).__name__)
    logger.error("unexpected error", exc_info=exc)
    return ServiceError("internal error")


OPENAI_PATHS = ("/v1/chat/", "/v1/models")
"""Routes whose errors take OpenAI's shape, which the openai SDK parses."""
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def openai_shaped(scope: Scope) -> bool:
    """Whether the request's route (its path under the app's route prefix) is an OpenAI one."""
    path, prefix = scope.get("path", ""), scope.get("root_path", "")
    return (path[len(prefix) :] if prefix and path.startswith(prefix) else path).startswith(OPENAI_PATHS)


def error_response(error: ServiceError, *, openai: bool = False) -> JSONResponse:
    """`{"detail": ...}` as every route of API v1 answers, or OpenAI's `{"error": {...}}`."""
    body = error.body()
    if openai:
        detail = body.pop("detail")
        message = detail if isinstance(detail, str) else "; ".join(_validation_line(e) for e in detail)
        body = {
            "error": {
                "message": message,
                "type": _OPENAI_TYPES.get(error.status_code, "server_error"),
                "param": body.pop("param", None),
                "code": body.pop("code", None),
                **body,
            }
        }
    return JSONResponse(status_code=error.status_code, content=body, headers=error.headers())


def _validation_line(error: Any) -> str:
    if isinstance(error, dict):
        where = ".".join(str(part) for part in error.get("loc", ()))
        return f"{where}: {error.get('msg', '')}" if where else str(error.get("msg", error))
    return str(error)


async def handle_error(request: Request, exc: Exception) -> JSONResponse:
    return error_response(as_service_error(exc), openai=openai_shaped(request.scope))


def install_error_handlers(app: FastAPI) -> None:
    for kind in (ServiceError, RequestValidationError, HTTPException, *BACKEND_ERRORS, AttributeError):
        app.add_exception_handler(kind, handle_error)
