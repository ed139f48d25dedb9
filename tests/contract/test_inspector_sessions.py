"""The inspector's sessions in the app of one replica, in process, on the real stores: with API keys
off (the embedded profile on loopback) the pages open without sign-in and a destructive form still
needs its CSRF token; with keys on, a session ends with its key, and cookies of the other mode,
forged tenants and cross-site forms are refused."""

from __future__ import annotations

import uuid

import httpx
import pytest

from serve_app.api.http import create_http_app
from serve_app.core.auth import hash_key
from serve_app.core.inspector_auth import COOKIE
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores
from tests.in_process import replica_dependencies

SECRET = "in-process-ui-secret"
KEY = "key-in-process-0123456789"


async def _app(backends, embed, **settings_args):
    settings = Settings(**backends.env, milvus_collection="inspector_sessions", ui_secret=SECRET, **settings_args)
    stores = await Stores.connect(settings)

    deps = replica_dependencies(settings, stores, embed)
    return stores, deps, create_http_app(deps)


@pytest.fixture
async def keys_off(backends, embed):
    stores, _, app = await _app(backends, embed)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
        yield client
    await stores.close()


@pytest.fixture
async def keys_on(backends, embed):
    stores, deps, app = await _app(backends, embed, api_keys={hash_key(KEY): "in-process"})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
        yield client, deps
    await stores.close()


async def test_pages_open_without_sign_in_and_a_delete_still_needs_the_token(keys_off):
    user = f"ko-{uuid.uuid4().hex[:8]}"
    memory = (await keys_off.post(f"/v1/users/{user}/memories", json={"text": "Keys are off on loopback."})).json()
    page = await keys_off.get(f"/ui/users/{user}")
    assert page.status_code == 200 and "Keys are off on loopback." in page.text
    assert COOKIE in keys_off.cookies  # an anonymous session: what the forms' CSRF token is made from
    assert "Sign out" not in page.text
    forged = await keys_off.post("/ui/actions/delete_memory", data={"user_id": user, "memory_id": memory["id"]})
    assert forged.status_code == 403
    confirm = await keys_off.get("/ui/confirm/delete_memory", params={"user_id": user, "memory_id": memory["id"]})
    token = confirm.text.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
    done = await keys_off.post(
        "/ui/actions/delete_memory", data={"user_id": user, "memory_id": memory["id"], "csrf_token": token}
    )
    assert done.status_code == 303 and done.headers["location"] == "/ui/audit?done=delete_memory"
    assert (await keys_off.get(f"/v1/users/{user}/memories")).json() == []
    audit = (await keys_off.get("/v1/audit", params={"limit": 1})).json()["entries"][0]
    assert audit["actor"] == "local" and audit["via"] == "inspector" and audit["target"]["memory_id"] == memory["id"]


async def test_with_keys_on_a_session_lives_only_as_long_as_its_key_and_its_tenant(keys_on):
    client, deps = keys_on
    assert (await client.get("/ui")).status_code == 303  # to the sign-in page
    cross = await client.post("/ui/login", data={"api_key": KEY}, headers={"sec-fetch-site": "cross-site"})
    assert cross.status_code == 403 and COOKIE not in cross.cookies  # login CSRF: no session from another site
    signer = deps.signer
    revoked = signer.issue("in-process", hash_key("a key removed from the key file"))
    other_tenant = signer.issue("someone-else", hash_key(KEY))
    keys_off_cookie = signer.issue(deps.settings.default_tenant, "local")
    for cookie in (revoked, other_tenant):
        r = await client.get("/v1/users", cookies={COOKIE: cookie})
        assert r.status_code == 401 and "sign in again" in r.json()["detail"]
    assert (await client.get("/v1/users", cookies={COOKIE: keys_off_cookie})).status_code == 401
    assert (await client.get("/ui", cookies={COOKIE: keys_off_cookie})).status_code == 303
    signed_in = await client.post("/ui/login", data={"api_key": KEY, "next": "/ui/audit"})
    assert signed_in.status_code == 303 and signed_in.headers["location"] == "/ui/audit"
    cookie = signed_in.cookies[COOKIE]
    assert (await client.get("/v1/users", cookies={COOKIE: cookie})).status_code == 200
    empty = await client.get("/ui/confirm/forget_user", params={"user_id": ""}, cookies={COOKIE: cookie})
    assert empty.status_code == 422
    token = signer.csrf_token(signer.read(cookie))
    sneaky = await client.post(
        "/ui/actions/forget_user", data={"user_id": "alice/facts/k", "csrf_token": token}, cookies={COOKIE: cookie}
    )
    assert sneaky.status_code == 422  # an id that would make another API path


async def test_with_keys_off_a_cookie_signed_while_keys_were_on_is_replaced(keys_off, backends, embed):
    stores, deps, _ = await _app(backends, embed)
    try:
        stale = deps.signer.issue("in-process", hash_key(KEY))
    finally:
        await stores.close()
    page = await keys_off.get("/ui", cookies={COOKIE: stale})
    assert page.status_code == 200 and keys_off.cookies[COOKIE] != stale
