"""`max_body_bytes` for a body of any framing: a declared length is checked before anyone reads the
body; a body without one (chunked) is counted as it arrives and cut off at the limit."""

from __future__ import annotations

import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.api.error_responses import error_response, openai_shaped
from serve_app.errors import PayloadTooLarge

IMPORT_PATH = re.compile(r"/v1/users/[^/]+/import")


class _OverLimit(Exception):
    """Raised to the app from `receive`: the body went past the limit, the app must not use it."""


class _CountedBody:
    """One request's receive and send, counting the body. Once it is over the limit, the app's own
    answer to the cut body (a 400 for JSON it could not parse, say) is dropped: the client hears 413."""

    def __init__(self, receive: Receive, send: Send, limit: int):
        self._receive = receive
        self._send = send
        self.limit = limit
        self.received = 0
        self.over = False
        self.started = False

    async def receive(self) -> Message:
        if self.over:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit:
                self.over = True
                raise _OverLimit()
        return message

    async def send(self, message: Message) -> None:
        if self.over:
            return
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)


class BodySizeLimit:
    """Oversize bodies are refused with 413, and nothing of them reaches a route.

    A declared Content-Length is trusted as the bound: the HTTP server that parsed the request
    (uvicorn, in the replica or in Serve's proxy) frames the body by it and never delivers more, so
    such requests pass with no wrapper at all. A plain ASGI
    middleware: Starlette's `@app.middleware("http")` wraps every response in a stream, a cost on
    every request. Serve logs each request itself, so this one only guards."""

    def __init__(self, inner: ASGIApp, limit: int, import_limit: int | None = None):
        self.inner = inner
        self.limit = limit
        self.import_limit = limit if import_limit is None else import_limit

    def _limit(self, scope: Scope) -> int:
        """An archive import has a limit of its own: a user's archive outgrows any other body."""
        path: str = scope.get("path", "")
        return self.import_limit if scope.get("method") == "POST" and IMPORT_PATH.fullmatch(path) else self.limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        limit = self._limit(scope)
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit():
            if int(declared) > limit:
                too_large = f"request body of {int(declared)} bytes is over the {limit}-byte limit"
                await self._refuse(too_large, scope, receive, send)
                return
            await self.inner(scope, receive, send)
            return
        counted = _CountedBody(receive, send, limit)
        try:
            await self.inner(scope, counted.receive, counted.send)
        except Exception:  # whatever the app made of the cut body (an exception group, say)
            if not counted.over:
                raise
        if counted.over and not counted.started:
            await self._refuse(f"request body is over the {limit}-byte limit", scope, receive, send)

    async def _refuse(self, message: str, scope: Scope, receive: Receive, send: Send) -> None:
        await error_response(PayloadTooLarge(message), openai=openai_shaped(scope))(scope, receive, send)
