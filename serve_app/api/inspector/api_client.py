"""The inspector's only way to the data: the public API, called in-process over ASGI with the
signed-in session's cookie and CSRF token, so a page can do nothing a client of the API cannot."""

from __future__ import annotations

from typing import Any

import httpx
from starlette.types import ASGIApp

from serve_app.core.inspector_auth import COOKIE, CSRF_HEADER


class ApiError(Exception):
    def __init__(self, status: int, detail: Any):
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail


class InspectorApi:
    def __init__(self, app: ASGIApp, cookie: str, csrf_token: str):
        self._client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://localhost",  # a loopback name: the keyless Host check admits it
            cookies={COOKIE: cookie},
            headers={CSRF_HEADER: csrf_token},
            timeout=30,
        )

    async def __aenter__(self) -> InspectorApi:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self._client.aclose()

    async def call(self, method: str, path: str, *, params: dict[str, Any] | None = None, json: Any = None) -> Any:
        response = await self._client.request(method, path, params=params, json=json)
        try:
            body = response.json()
        except ValueError:
            body = None
        if not response.is_success or body is None:
            detail = body.get("detail", response.text) if isinstance(body, dict) else response.text or "no answer"
            raise ApiError(response.status_code if response.status_code >= 400 else 502, detail)
        return body

    async def get(self, path: str, **params: Any) -> Any:
        return await self.call("GET", path, params={k: v for k, v in params.items() if v is not None})

    async def post(self, path: str, body: Any) -> Any:
        return await self.call("POST", path, json=body)

    async def delete(self, path: str) -> Any:
        return await self.call("DELETE", path)
