"""The HTTP app of one replica, in process, on the session's real stores: for the tests of request
edges (body limits, Host checks) under settings the shared Serve app does not run with."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import httpx

from serve_app.api.http import create_http_app
from serve_app.encoding import EmbedMany
from serve_app.llm.client import llm_client
from serve_app.services.dependencies import Dependencies
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores


async def _not_here(*_args):
    raise AssertionError("nothing is embedded or compacted in these tests")


def replica_dependencies(settings: Settings, stores: Stores, embed: EmbedMany | None = None) -> Dependencies:
    """What an Ingress replica hands its app, built from `settings` as the replica builds it: keys,
    inspector signer, the LLM client; queries embedded by `embed` (the real model) when given.
    Nothing is compacted in process."""

    async def embed_one(text: str) -> list[float]:
        return (await embed([text]))[0]

    return Dependencies(
        settings=settings,
        stores=stores,
        embed_one=embed_one if embed is not None else _not_here,
        embed_documents=embed if embed is not None else _not_here,
        compact_now=_not_here,
        keyring=settings.keyring(),
        signer=settings.inspector_signer(),
        llm=llm_client(settings),
    )


@asynccontextmanager
async def in_process_client(
    backends,
    *,
    mcp: bool = False,
    base_url: str = "http://127.0.0.1:8000",
    embed: EmbedMany | None = None,
    **settings_args,
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the app built from `settings_args` (plus the backends' URLs). With `mcp`, the app's
    lifespan runs (the MCP session manager): enter it in the test itself, since a lifespan must end in
    the task it began in, and an assertion inside it surfaces wrapped in an exception group. `embed`:
    the real model, for tests that write memories."""
    settings = Settings(**backends.env, milvus_collection="request_edges", **settings_args)
    stores = await Stores.connect(settings)
    app = create_http_app(replica_dependencies(settings, stores, embed))
    try:
        async with AsyncExitStack() as stack:
            if mcp:
                await stack.enter_async_context(app.router.lifespan_context(app))
            transport = httpx.ASGITransport(app=app)
            yield await stack.enter_async_context(httpx.AsyncClient(transport=transport, base_url=base_url, timeout=30))
    finally:
        await stores.close()
