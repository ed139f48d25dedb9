"""One handler maps every error to its response: status, body shape and headers, as clients see them.

The handlers run on the event loop: Starlette sends a plain `def` handler to a worker thread (a
thread start and two hand-offs per error response)."""

from __future__ import annotations

import errno
import inspect

import asyncpg
import pytest
import redis.exceptions
from fastapi import APIRouter
from fastapi.testclient import TestClient
from pydantic import BaseModel
from pymilvus.exceptions import MilvusException

from serve_app import errors
from serve_app.api.http import ROUTERS, create_http_app
from serve_app.services.dependencies import Dependencies
from serve_app.settings import Settings

LOOPBACK = "http://127.0.0.1"
"""The apps here run with API keys off, which serve only requests addressed to a loopback name."""


async def _never(*_args):
    raise AssertionError("no store or model is reached in these tests")


def _app(raised: BaseException | None = None):
    deps = Dependencies(
        settings=Settings(max_body_bytes=2048), stores=None, embed_one=_never, embed_documents=_never, compact_now=_never
    )
    app = create_http_app(deps)
    router = APIRouter()

    @router.get("/raise")
    async def raise_it():
        raise raised

    app.include_router(router)
    return app


def _get(raised: BaseException):
    with TestClient(_app(raised), base_url=LOOPBACK, raise_server_exceptions=False) as client:
        return client.get("/raise")


def test_every_exception_handler_is_a_coroutine_function():
    app = _app()
    sync = [
        f"{exc!r}: {handler!r}" for exc, handler in app.exception_handlers.items() if not inspect.iscoroutinefunction(handler)
    ]
    assert not sync, f"plain-def exception handlers run on a worker thread: {sync}"


@pytest.mark.parametrize(
    ("raised", "status", "body", "headers"),
    [
        (errors.SessionNotFound("s1"), 404, {"detail": "session not found"}, {}),
        (errors.FactNotFound(), 404, {"detail": "fact not found"}, {}),
        (errors.MemoryNotFound(), 404, {"detail": "memory not found"}, {}),
        (errors.SessionOwnerError("alice"), 409, {"detail": "session belongs to another user"}, {}),
        (errors.CompactionConflict("lost 8 races"), 409, {"detail": "lost 8 races"}, {"retry-after": "1"}),
        (errors.BudgetError("too big", {"system": 9}), 422, {"detail": "too big", "token_counts": {"system": 9}}, {}),
        (errors.RateLimited("rate limit of 5 messages per minute reached", 7), 429, None, {"retry-after": "7"}),
        (errors.QuotaExceeded(3, 3), 429, None, {"retry-after": "3600"}),
        (errors.Unauthorized(), 401, {"detail": "missing or invalid API key"}, {"www-authenticate": "Bearer"}),
        (errors.RecallUnavailable("dense, keyword"), 503, None, {"retry-after": "2"}),
    ],
)
def test_service_errors_answer_with_their_status_body_and_headers(raised, status, body, headers):
    response = _get(raised)
    assert response.status_code == status, response.text
    if body is not None:
        assert response.json() == body
    assert isinstance(response.json()["detail"], str) and response.json()["detail"]
    for name, value in headers.items():
        assert response.headers[name] == value


@pytest.mark.parametrize(
    "raised",
    [
        redis.exceptions.ConnectionError("Error 111 connecting"),
        redis.exceptions.TimeoutError("Timeout reading from socket"),
        asyncpg.CannotConnectNowError("the database system is starting up"),
        # A pooled connection a PostgreSQL crash left mid-exchange: the statement was never sent
        # (tests/contract/test_pg_pool.py kills the server under load to meet it).
        asyncpg.InternalClientError("cannot switch to state 15; another operation (2) is in progress"),
        MilvusException(message="server unavailable"),
        ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed"),
        TimeoutError(),
        OSError(errno.EHOSTUNREACH, "No route to host"),
        OSError("Multiple exceptions: [Errno 111] Connect call failed ('::1', 5432), [Errno 111] Connect call failed"),
    ],
)
def test_an_unreachable_store_is_a_503_to_retry(raised):
    response = _get(raised)
    assert response.status_code == 503
    assert response.json() == {"detail": f"a backing store is unavailable ({type(raised).__name__}); retry later"}
    assert response.headers["retry-after"] == "2"


@pytest.mark.parametrize(
    "raised",
    [
        redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"),
        redis.exceptions.MasterDownError("MASTERDOWN Link with MASTER is down"),
        redis.exceptions.TryAgainError("TRYAGAIN Multiple keys request during rehashing of slot"),
        redis.exceptions.ReadOnlyError("READONLY You can't write against a read only replica."),
        redis.exceptions.MovedError("3999 127.0.0.1:6381"),
        redis.exceptions.ClusterError("TTL exhausted."),
        redis.exceptions.SlotNotCoveredError("Slot 3999 not covered by the cluster."),
        errors.ReplicasUnconfirmed(0, 1),
    ],
    ids=lambda exc: type(exc).__name__,
)
def test_a_store_moving_is_a_503_to_retry(raised):
    """A failover, a slot migrating or a demoted primary: the same request succeeds later."""
    response = _get(raised)
    assert response.status_code == 503 and response.headers["retry-after"]


async def test_a_connection_closed_under_a_command_is_a_503():
    """redis-py's cluster client can hit a connection another task closed: its writer is None (an
    AttributeError before redis-py 8, a ConnectionError since)."""
    from redis.asyncio.connection import Connection

    connection = Connection()
    try:
        await connection._send_packed_command([b"PING"])
    except (AttributeError, redis.exceptions.ConnectionError) as exc:
        closed = exc
    response = _get(closed)
    assert response.status_code == 503 and response.headers["retry-after"]


@pytest.mark.parametrize(
    "raised",
    [
        redis.exceptions.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
        redis.exceptions.ResponseError("ERR Error running script (call to f_0123): user_script:1: oops"),
        redis.exceptions.NoScriptError("NOSCRIPT No matching script."),
        AttributeError("'NoneType' object has no attribute 'seqs'"),
    ],
    ids=["wrongtype", "script", "noscript", "own-attribute-error"],
)
def test_a_store_refusing_the_command_stays_a_500(raised):
    response = _get(raised)
    assert response.status_code == 500 and "retry-after" not in response.headers


def test_a_file_error_is_a_fault_not_an_outage():
    response = _get(FileNotFoundError(errno.ENOENT, "No such file", "/etc/memserve/api-keys"))
    assert response.status_code == 500 and response.json() == {"detail": "internal error"}
    assert "retry-after" not in response.headers


class _Body(BaseModel):
    value: int


@pytest.mark.parametrize("raw", [b'{"value": "\\ud800"}', b'{"value": NaN}'])
def test_a_422_echoes_hostile_input_and_stays_json(raw):
    app = _app()
    router = APIRouter()

    @router.post("/echo")
    async def echo(body: _Body):
        return body.value

    app.include_router(router)
    with TestClient(app, base_url=LOOPBACK) as client:
        response = client.post("/echo", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "value"]


def test_an_oversize_body_is_refused_before_it_is_read():
    with TestClient(_app(), base_url=LOOPBACK) as client:
        response = client.post("/v1/context", content=b"x" * 4096, headers={"content-type": "application/json"})
    assert response.status_code == 413 and "2048-byte limit" in response.json()["detail"]


def test_errors_cross_a_process_boundary_whole():
    import pickle

    for error in (
        errors.FactNotFound(),
        errors.CompactionConflict("lost"),
        errors.QuotaExceeded(3, 4),
        errors.SessionNotFound("s"),
    ):
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error) and again.body() == error.body() and again.headers() == error.headers()


def test_every_route_dependency_runs_on_the_event_loop():
    """A plain `def` dependency runs on a worker thread: a thread hand-off on every request."""
    from fastapi.routing import APIRoute

    def sync_calls(dependant, route: str) -> list[str]:
        found = []
        for sub in dependant.dependencies:
            call = sub.call
            target = call if inspect.isfunction(call) else getattr(call, "__call__", call)  # noqa: B004
            if not inspect.iscoroutinefunction(target):
                found.append(f"{route}: {getattr(call, '__name__', call)!r}")
            found += sync_calls(sub, route)
        return found

    routes = [r for router in ROUTERS for r in router.routes if isinstance(r, APIRoute)]
    assert len(routes) >= 18
    sync = [name for r in routes for name in sync_calls(r.dependant, r.path)]
    assert not sync, f"plain-def dependencies run on a worker thread: {sync}"


def test_routing_refusals_take_the_shape_of_their_path():
    """Starlette's own 404 and 405 answer as the rest of their path does: `{"detail": ...}` with
    `Allow` in API v1, OpenAI's `{"error": {...}}` under the OpenAI-compatible routes."""
    with TestClient(_app(), base_url=LOOPBACK, raise_server_exceptions=False) as client:
        v1 = client.put("/v1/context")
        models = client.request("TRACE", "/v1/models")
        chat = client.get("/v1/chat/completions")
        unknown = client.get("/v1/chat/nothing-here")
    assert (v1.status_code, v1.json(), v1.headers["allow"]) == (405, {"detail": "Method Not Allowed"}, "POST")
    assert models.status_code == 405 and models.headers["allow"] == "GET"
    assert models.json()["error"]["message"] == "Method Not Allowed"
    assert chat.status_code == 405 and chat.json()["error"]["message"] == "Method Not Allowed"
    assert unknown.status_code == 404
    assert unknown.json()["error"] == {"message": "Not Found", "type": "not_found_error", "param": None, "code": None}
