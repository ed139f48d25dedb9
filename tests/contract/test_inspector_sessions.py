"""The inspector with API keys off (the embedded profile on loopback): the pages open without
sign-in, as the API does, and a destructive form still needs its CSRF token. The app of one
replica in process, on the real stores."""

from __future__ import annotations

import uuid

import httpx
import pytest

from serve_app.api.http import create_http_app
from serve_app.core.inspector_auth import COOKIE
from serve_app.services.dependencies import Dependencies
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores


@pytest.fixture
async def keys_off(backends, embed):
    settings = Settings(**backends.env, milvus_collection="inspector_keys_off")
    stores = await Stores.connect(settings)

    async def embed_one(text: str) -> list[float]:
        return (await embed([text]))[0]

    async def no_compaction(*_: str) -> dict:
        raise AssertionError("not compacted here")

    deps = Dependencies(
        settings=settings, stores=stores, embed_one=embed_one, compact_now=no_compaction, signer=settings.inspector_signer()
    )
    app = create_http_app(deps)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
        yield client
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
