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

from serve_app.errors import InvalidRequest, ServiceError, Unavailable

logger = logging.getLogger("ray.serve")

# What the store clients raise when their server is unreachable or too slow to answer.
BACKEND_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
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
    return isinstance(exc, BACKEND_ERRORS)


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


def as_service_error(exc: BaseException) -> ServiceError:
    """The service error an exception answers as."""
    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, RequestValidationError):
        # A lone surrogate or a NaN sent by the client would otherwise turn the 422 into a 500.
        return InvalidRequest(_echoable(jsonable_encoder(exc.errors())))
    if backend_unreachable(exc):
        logger.warning("backend unavailable: %r", exc)
        return Unavailable(type(exc).__name__)
    logger.error("unexpected error", exc_info=exc)
    return ServiceError("internal error")


def error_response(error: ServiceError) -> JSONResponse:
    return JSONResponse(status_code=error.status_code, content=error.body(), headers=error.headers())


async def handle_error(request: Request, exc: Exception) -> JSONResponse:
    return error_response(as_service_error(exc))


def install_error_handlers(app: FastAPI) -> None:
    for kind in (ServiceError, RequestValidationError, *BACKEND_ERRORS):
        app.add_exception_handler(kind, handle_error)
