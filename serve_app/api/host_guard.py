"""The keyless service answers only requests addressed to its own names (core/hosts.py): REST,
`/mcp` and `/ui` alike, before any route reads the request."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from serve_app.api.error_responses import error_response, openai_shaped
from serve_app.core.hosts import HostPolicy
from serve_app.errors import HostNotAllowed, OriginNotAllowed, ServiceError


class HostGuard:
    """421 for a Host outside the policy, 403 for a page of another site (its Origin). Installed
    only with API keys off: with keys on, a page cannot call without the key, whatever its name."""

    def __init__(self, inner: ASGIApp, policy: HostPolicy):
        self.inner = inner
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and (refused := self._refusal(scope)) is not None:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008, "reason": str(refused.detail)[:120]})
                return
            await error_response(refused, openai=openai_shaped(scope))(scope, receive, send)
            return
        await self.inner(scope, receive, send)

    def _refusal(self, scope: Scope) -> ServiceError | None:
        host = origin = None
        for name, value in scope["headers"]:
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"origin":
                origin = value.decode("latin-1")
        if not self.policy.allows_host(host):
            return HostNotAllowed(host)
        if not self.policy.allows_origin(origin):
            return OriginNotAllowed(origin or "")
        return None
