"""The inspector's pages: Jinja2 templates rendered from public API calls (`api_client`).

Reading works with JavaScript blocked; every action is a form: a confirmation page first, then a
POST that carries the session's CSRF token, which the API checks again. Sign-in exchanges the API
key for the signed cookie once; the key is never put in a URL, a page or browser storage.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from serve_app.api.inspector.api_client import ApiError, InspectorApi
from serve_app.api.inspector.views import ACTIONS, budget_bar, log_rows, named_spaces, omitted_seqs
from serve_app.core.ids import ID_PATTERN, MAX_ID_LENGTH
from serve_app.core.inspector_auth import COOKIE, CSRF_FIELD, InspectorSession
from serve_app.core.spaces import MAX_SPACES_PER_REQUEST
from serve_app.services.dependencies import Dependencies
from serve_app.services.memories import MAX_RESULT_WINDOW

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")
router = APIRouter(prefix="/ui", include_in_schema=False)
ASSETS = {"inspector.css": "text/css", "inspector.js": "text/javascript"}
LOG_PAGE = 50
MEMORY_PAGE = 50
SPACES_FIELD = MAX_SPACES_PER_REQUEST * (MAX_ID_LENGTH + 2)
"""The longest spaces field: as many names as a request may name, with their separators."""

# The pages hold memories: never cached, never framed, no script but our own.
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Inline style attributes only for the budget bar's widths; scripts come from our own file alone.
    "Content-Security-Policy": (
        "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
}


class _SignIn(Exception):
    """The page needs a signed-in session."""


def _deps(request: Request) -> Dependencies:
    return request.app.state.dependencies


def _session(request: Request) -> tuple[InspectorSession, str, bool]:
    """(session, cookie, new): the signed-in session; with keys off, an anonymous one made on first
    visit (its nonce is what the CSRF token of the forms is made from)."""
    deps = _deps(request)
    if deps.signer is None:
        raise ApiError(503, "the inspector needs ui_secret (MEMSERVE_UI_SECRET) set to the same secret on every replica")
    cookie = request.cookies.get(COOKIE, "")
    session = deps.signer.read(cookie)
    # A cookie of the other mode (signed before keys were turned on or off) is no session here.
    if session is not None and (session.key_digest != "local") == deps.keyring.enabled:
        return session, cookie, False
    if deps.keyring.enabled:
        raise _SignIn()
    cookie = deps.signer.issue(deps.settings.default_tenant, "local")
    return deps.signer.read(cookie), cookie, True  # type: ignore[return-value]


def _set_cookie(request: Request, response: Response, cookie: str) -> None:
    response.set_cookie(
        COOKIE,
        cookie,
        max_age=_deps(request).settings.ui_session_max_age_s,
        httponly=True,
        samesite="strict",
        secure=_https(request),
        path="/",
    )


def _https(request: Request) -> bool:
    """Behind a proxy that terminates TLS the request reaches the replica as plain HTTP."""
    forwarded = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    return request.url.scheme == "https" or forwarded == "https"


def _cross_site(request: Request) -> bool:
    """A form POST from another site (login CSRF: signing the visitor into the attacker's tenant).
    Browsers send Sec-Fetch-Site, or at least Origin, with every POST."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return site not in ("same-origin", "none")
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin == "null"
    scheme = "https" if _https(request) else request.url.scheme
    return origin.rstrip("/") not in {
        f"{scheme}://{request.headers.get('host', '')}",
        f"{request.url.scheme}://{request.url.netloc}",
    }


def _refused(request: Request, status: int, detail: str) -> Response:
    return _render(request, "error.html", {"status": status, "detail": detail}, status=status)


CROSS_SITE = "a form posted from another site is refused: open the inspector itself and submit it there"


def _render(request: Request, name: str, context: dict[str, Any], *, status: int = 200, cookie: str | None = None) -> Response:
    response = templates.TemplateResponse(request, name, context, status_code=status, headers=SECURITY_HEADERS)
    if cookie:
        _set_cookie(request, response, cookie)
    return response


def _login_redirect(request: Request) -> Response:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/ui/login?{urlencode({'next': target})}", status_code=303)


async def _via_api(request: Request, build, answer) -> Response:
    """Run `build(api)` as the visitor's session and let `answer(result, page)` make the response
    (`page`: what every template needs); API errors become an error page (401 with keys on: sign in)."""
    try:
        session, cookie, new = _session(request)
    except _SignIn:
        return _login_redirect(request)
    except ApiError as exc:
        return _refused(request, exc.status, exc.detail)
    deps = _deps(request)
    csrf = deps.signer.csrf_token(session)  # type: ignore[union-attr]
    try:
        async with InspectorApi(request.app, cookie, csrf) as api:
            result = await build(api)
    except ApiError as exc:
        if exc.status == 401 and deps.keyring.enabled:
            return _login_redirect(request)
        return _refused(request, exc.status, exc.detail)
    page = {"csrf_token": csrf, "csrf_field": CSRF_FIELD, "tenant": session.tenant, "signed_in": deps.keyring.enabled}
    response = answer(result, page)
    if new:
        _set_cookie(request, response, cookie)
    return response


async def _page(request: Request, name: str, build) -> Response:
    """Render `name` with what `build(api)` returns."""
    return await _via_api(request, build, lambda context, page: _render(request, name, context | page))


def _q(value: str) -> str:
    return quote(value, safe="")


# Sign-in


@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request, next: str = Query("/ui", max_length=2048)) -> Response:
    return _render(request, "login.html", {"next": _safe_next(next), "error": None})


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request, api_key: str = Form(..., max_length=512), next: str = Form("/ui", max_length=2048)) -> Response:
    deps = _deps(request)
    if _cross_site(request):
        return _refused(request, 403, CROSS_SITE)
    if deps.signer is None:
        return _refused(request, 503, "sign-in is off: set ui_secret (MEMSERVE_UI_SECRET) on every replica")
    found = deps.keyring.tenant_for(api_key) if deps.keyring.enabled else (deps.settings.default_tenant, "local")
    if found is None:
        return _render(request, "login.html", {"next": _safe_next(next), "error": "That API key is not valid."}, status=401)
    response = RedirectResponse(_safe_next(next), status_code=303)
    _set_cookie(request, response, deps.signer.issue(*found))
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    if _cross_site(request):
        return _refused(request, 403, CROSS_SITE)
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response


def _safe_next(target: str) -> str:
    """Only a path of the inspector: a sign-in link cannot send the browser elsewhere."""
    return target if target.startswith("/ui") and "//" not in target and "\\" not in target else "/ui"


# Reading


@router.get("", response_class=HTMLResponse)
async def home(request: Request, after: str = Query("", max_length=MAX_ID_LENGTH)) -> Response:
    async def build(api: InspectorApi) -> dict[str, Any]:
        return {"users": await api.get("/v1/users", after=after or None, limit=50), "stats": await api.get("/v1/stats")}

    return await _page(request, "home.html", build)


@router.get("/users/{user_id}", response_class=HTMLResponse)
async def user(request: Request, user_id: str, offset: int = Query(0, ge=0, le=MAX_RESULT_WINDOW - MEMORY_PAGE)) -> Response:
    async def build(api: InspectorApi) -> dict[str, Any]:
        base = f"/v1/users/{_q(user_id)}"
        return {
            "user_id": user_id,
            "sessions": (await api.get(f"{base}/sessions"))["sessions"],
            "facts": await api.get(f"{base}/facts"),
            "memories": await api.get(f"{base}/memories", limit=MEMORY_PAGE, offset=offset),
            "offset": offset,
            "page": MEMORY_PAGE,
        }

    return await _page(request, "user.html", build)


@router.get("/users/{user_id}/search", response_class=HTMLResponse)
async def search(
    request: Request,
    user_id: str,
    query: str = Query("", max_length=8192),
    top_k: int = Query(10, ge=1, le=100),
    spaces: str = Query("", max_length=SPACES_FIELD),
) -> Response:
    async def build(api: InspectorApi) -> dict[str, Any]:
        explained = None
        if query.strip():
            body = {"query": query, "top_k": top_k, "explain": True, "spaces": named_spaces(spaces)}
            explained = await api.post(f"/v1/users/{_q(user_id)}/memories/search", body)
        return {"user_id": user_id, "query": query, "top_k": top_k, "spaces": spaces, "explained": explained}

    return await _page(request, "search.html", build)


@router.get("/users/{user_id}/facts/{key}", response_class=HTMLResponse)
async def fact(request: Request, user_id: str, key: str) -> Response:
    async def build(api: InspectorApi) -> dict[str, Any]:
        history = await api.get(f"/v1/users/{_q(user_id)}/facts/{_q(key)}/history")
        return {"user_id": user_id, "key": key, "history": sorted(history, key=lambda f: f["valid_from"], reverse=True)}

    return await _page(request, "fact.html", build)


@router.get("/spaces", response_class=HTMLResponse)
async def space_list(request: Request) -> Response:
    async def build(api: InspectorApi) -> dict[str, Any]:
        return {"spaces": await api.get("/v1/spaces")}

    return await _page(request, "spaces.html", build)


@router.get("/spaces/{space_id}", response_class=HTMLResponse)
async def space(request: Request, space_id: str, after: str = Query("", max_length=MAX_ID_LENGTH)) -> Response:
    """The space first: a key without a grant gets the API's 404 before anything of it is read."""

    async def build(api: InspectorApi) -> dict[str, Any]:
        base = f"/v1/spaces/{_q(space_id)}"
        info = await api.get(base)
        memories = await api.get(f"{base}/memories", after=after or None, limit=MEMORY_PAGE)
        return {
            "space": info,
            "memories": memories,
            "facts": await api.get(f"{base}/facts"),
            "grants": await api.get(f"{base}/grants") if info["role"] == "admin" else None,
            "after": after,
            "next_after": memories[-1]["id"] if len(memories) == MEMORY_PAGE else None,
        }

    return await _page(request, "space.html", build)


@router.get("/sessions/{session_id}", response_class=HTMLResponse)
async def session(request: Request, session_id: str, after: int = Query(0, ge=0, le=2**53)) -> Response:
    async def build(api: InspectorApi) -> dict[str, Any]:
        base = f"/v1/sessions/{_q(session_id)}"
        info = await api.get(base)
        page = await api.get(f"{base}/messages", after=after, limit=LOG_PAGE)
        return {
            "info": info,
            "page": page,
            "rows": log_rows(page["messages"], info),
            "after": after,
            "previous": max(0, after - LOG_PAGE) if after else None,
            "max_tokens": _deps(request).settings.default_max_tokens,
        }

    return await _page(request, "session.html", build)


@router.get("/sessions/{session_id}/prompt", response_class=HTMLResponse)
async def next_prompt(
    request: Request,
    session_id: str,
    query: str = Query("", max_length=8192),
    max_tokens: int = Query(8192, ge=256, le=1_048_576),
    system_prompt: str = Query("", max_length=65536),
    spaces: str = Query("", max_length=SPACES_FIELD),
) -> Response:
    settings = _deps(request).settings
    shared = named_spaces(spaces)

    async def build(api: InspectorApi) -> dict[str, Any]:
        info = await api.get(f"/v1/sessions/{_q(session_id)}")
        body: dict[str, Any] = {
            "user_id": info["user_id"],
            "session_id": session_id,
            "query": query,
            "max_tokens": max_tokens,
            "spaces": shared,
        }
        if system_prompt:
            body["system_prompt"] = system_prompt
        context = await api.post("/v1/context", body)
        explained = None
        if query.strip() and settings.recall_top_k:
            search_body = {"query": query, "top_k": min(100, settings.recall_top_k), "explain": True, "spaces": shared}
            explained = await api.post(f"/v1/users/{_q(info['user_id'])}/memories/search", search_body)
        unsummarized = await api.get(f"/v1/sessions/{_q(session_id)}/messages", after=info["covers_upto_seq"], limit=1000)
        return {
            "info": info,
            "query": query,
            "max_tokens": max_tokens,
            "system_prompt": system_prompt,
            "spaces": spaces,
            "context": context,
            "bar": budget_bar(context["usage"]),
            "omitted": omitted_seqs(unsummarized["messages"], context["included_seqs"]),
            "explained": explained,
            "in_prompt": {hit["id"] for hit in context["recalled"]},
        }

    return await _page(request, "prompt.html", build)


@router.get("/sessions/{session_id}/export")
async def export(request: Request, session_id: str) -> Response:
    """The API's export as a file download."""
    headers = {**SECURITY_HEADERS, "Content-Disposition": f'attachment; filename="session-{session_id}.json"'}
    return await _via_api(
        request,
        lambda api: api.get(f"/v1/sessions/{_q(session_id)}/export"),
        lambda data, _: JSONResponse(data, headers=headers),
    )


@router.get("/static/{name}")
async def asset(name: str) -> Response:
    if name not in ASSETS:
        return Response(status_code=404)
    return FileResponse(HERE / "static" / name, media_type=ASSETS[name], headers={"Cache-Control": "max-age=300"})


@router.get("/audit", response_class=HTMLResponse)
async def audit(
    request: Request, before: int | None = Query(None, ge=1, le=2**62), done: str = Query("", max_length=64)
) -> Response:
    async def build(api: InspectorApi) -> dict[str, Any]:
        return {"audit": await api.get("/v1/audit", before=before, limit=50), "done": done if done in ACTIONS else ""}

    return await _page(request, "audit.html", build)


# Actions: confirm, then POST with the CSRF token


def _invalid_fields(fields: dict[str, str]) -> str | None:
    """Each id of an action names one thing: an empty or malformed one would make another API path."""
    for name, value in fields.items():
        if not re.fullmatch(ID_PATTERN, value):
            return f"{name} must be an id (letters, digits and . _ @ -, at most {MAX_ID_LENGTH} characters), not {value!r}"
    return None


@router.get("/confirm/{action}", response_class=HTMLResponse)
async def confirm(request: Request, action: str) -> Response:
    if action not in ACTIONS:
        return _refused(request, 404, f"no action {action!r}")
    fields = {name: request.query_params.get(name, "") for name in ACTIONS[action].fields}
    if (bad := _invalid_fields(fields)) is not None:
        return _refused(request, 422, bad)

    async def build(_: InspectorApi) -> dict[str, Any]:
        return {"action": action, "spec": ACTIONS[action], "fields": fields}

    return await _page(request, "confirm.html", build)


@router.post("/actions/{action}")
async def act(request: Request, action: str) -> Response:
    deps = _deps(request)
    if action not in ACTIONS:
        return _refused(request, 404, f"no action {action!r}")
    if _cross_site(request):
        return _refused(request, 403, CROSS_SITE)
    try:
        session, cookie, _ = _session(request)
    except _SignIn:
        return _refused(request, 401, "sign in first")
    except ApiError as exc:
        return _refused(request, exc.status, exc.detail)
    form = await request.form()
    token = str(form.get(CSRF_FIELD, ""))
    if not deps.signer.csrf_ok(session, token):  # type: ignore[union-attr]
        detail = "missing or invalid CSRF token: open the page again and confirm from it"
        return _refused(request, 403, detail)
    spec = ACTIONS[action]
    fields = {name: str(form.get(name, "")) for name in spec.fields}
    if (bad := _invalid_fields(fields)) is not None:
        return _refused(request, 422, bad)
    try:
        async with InspectorApi(request.app, cookie, token) as api:
            await api.delete(spec.path.format(**{k: _q(v) for k, v in fields.items()}))
    except ApiError as exc:
        return _refused(request, exc.status, exc.detail)
    return RedirectResponse(f"/ui/audit?{urlencode({'done': action})}", status_code=303)
