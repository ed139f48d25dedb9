"""The ingress's exception handlers run on its event loop: Starlette sends a plain `def` handler
to a worker thread (a thread start and two hand-offs per error response)."""

from __future__ import annotations

import inspect

from deployments.ingress import app


def test_every_exception_handler_is_a_coroutine_function():
    sync = [
        f"{exc.__name__ if isinstance(exc, type) else exc}: {handler!r}"
        for exc, handler in app.exception_handlers.items()
        if not inspect.iscoroutinefunction(handler)
    ]
    assert not sync, f"plain-def exception handlers run on a worker thread: {sync}"


def test_the_service_errors_have_handlers():
    from serve_app.core.budget import BudgetError
    from serve_app.services.compaction import CompactionConflict, SessionNotFound
    from serve_app.stores.rate_limit import RateLimited
    from serve_app.stores.session_log import SessionOwnerError

    for exc in (BudgetError, CompactionConflict, RateLimited, SessionNotFound, SessionOwnerError):
        assert exc in app.exception_handlers, exc
