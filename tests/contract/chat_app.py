"""The chat endpoint of one replica's app, in process, on the real stores, with its model a
`ScriptedUpstream` (a TEST DOUBLE of the GPU model; the real path is tested in tests/llm)."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any

import httpx

from serve_app.api.http import create_http_app
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores
from tests.doubles import ScriptedUpstream
from tests.in_process import replica_dependencies

CHAT_COLLECTION = "chat_path"
CHAT_REDIS_DB = 3


@asynccontextmanager
async def chat_app(backends, embed, upstream: ScriptedUpstream, **settings_args: Any):
    """An httpx client of the app, its dependencies: `settings_args` override the settings."""
    # A Redis database of its own: the chat tests leave many sessions in the embedding lane (no
    # memorizer runs here), which the sweep tests' passes would otherwise read first.
    env = backends.env | {"REDIS_URL": backends.env["REDIS_URL"].rsplit("/", 1)[0] + f"/{CHAT_REDIS_DB}"}
    settings = Settings(
        **env,
        milvus_collection=CHAT_COLLECTION,
        llm_mode="openai",
        llm_base_url=upstream.base_url,
        llm_model=upstream.model,
        llm_api_key="sk-upstream-secret-0123456789abcdef",
        **settings_args,
    )
    stores = await Stores.connect(settings)

    deps = replica_dependencies(settings, stores, embed)
    transport = httpx.ASGITransport(app=create_http_app(deps))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=60) as client:
            yield client, deps
    finally:
        await deps.llm.close()
        await stores.close()
