"""Ingress deployment: the HTTP API v1 (`serve_app.api`), with the context builder in-process.

A thin shell: it owns the replica's state (store clients, the query encoder, handles to the
Embedder and the Memorizer, Prometheus metrics) and builds the replica's FastAPI app around it.
The context builder lives here rather than in its own deployment: building a context is I/O plus
pure budgeting, and another Serve hop would only add latency.
"""

from __future__ import annotations

import asyncio
import gc
import logging

from fastapi import FastAPI
from ray import serve
from ray.exceptions import RayTaskError
from ray.serve.context import _get_serve_request_context
from ray.serve.handle import DeploymentHandle
from ray.util import metrics
from starlette.types import ASGIApp, Receive, Scope, Send

from serve_app.api.http import create_http_app
from serve_app.deployments.redis_metrics import RedisConfirmMetrics
from serve_app.encoding.query import load_query_encoder
from serve_app.errors import ServiceError
from serve_app.llm.client import llm_client
from serve_app.runtime import tracing
from serve_app.services.dependencies import Dependencies
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores

logger = logging.getLogger("ray.serve")


class IngressMetrics:
    """Prometheus metrics of the request path (Ray exports them with the `ray_` prefix)."""

    def __init__(self) -> None:
        self.context_tokens = metrics.Histogram(
            "memserve_context_tokens",
            "Prompt tokens of built contexts.",
            boundaries=[256, 512, 1024, 2048, 4096, 8192, 16384, 32768],
        )
        self.section_tokens = metrics.Histogram(
            "memserve_context_section_tokens",
            "Tokens of each section of built contexts.",
            boundaries=[1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
            tag_keys=("section",),
        )
        self.recall_latency = metrics.Histogram(
            "memserve_recall_latency_ms",
            "Hybrid recall (embedding, dense and keyword search, fusion), by caller.",
            boundaries=[2, 5, 10, 15, 20, 30, 50, 100, 250, 1000],
            tag_keys=("path",),
        )

        self.first_token = metrics.Histogram(
            "memserve_chat_first_token_seconds",
            "Chat with memory, streamed: from the request to the first token of the answer.",
            boundaries=[0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30],
        )
        self.chat_calls = metrics.Counter(
            "memserve_chat_calls",
            "Chat calls, by how the request's history met the session log.",
            tag_keys=("alignment", "stream"),
        )
        self.chat_memory_tokens = metrics.Histogram(
            "memserve_chat_memory_tokens",
            "Tokens of recalled memories and facts memory added to a chat prompt.",
            boundaries=[1, 16, 64, 128, 256, 512, 1024, 2048, 4096],
        )
        self.abandoned = metrics.Counter("memserve_chat_streams_abandoned", "Chat streams the client left before the end.")

    def recall_ms(self, path: str, ms: float) -> None:
        self.recall_latency.observe(ms, tags={"path": path})

    def chat_call(self, alignment: str, memory_tokens: int, streamed: bool) -> None:
        self.chat_calls.inc(tags={"alignment": alignment, "stream": str(streamed).lower()})
        self.chat_memory_tokens.observe(memory_tokens)

    def first_token_s(self, seconds: float) -> None:
        self.first_token.observe(seconds)

    def stream_abandoned(self) -> None:
        self.abandoned.inc()

    def context_sections(self, total_tokens: int, sections: dict[str, int]) -> None:
        self.context_tokens.observe(total_tokens)
        for section, tokens in sections.items():
            self.section_tokens.observe(tokens, tags={"section": section})


class ServeRequestIds:
    """Serve's request id on the request's span (`ray.serve.request_id`): Serve writes its access log
    line after the span ended, with that id and no trace id, so the id leads from the line to the trace."""

    def __init__(self, inner: ASGIApp):
        self.inner = inner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            from opentelemetry import trace

            trace.get_current_span().set_attribute("ray.serve.request_id", _get_serve_request_context().request_id)
        await self.inner(scope, receive, send)


@serve.deployment(name="Ingress", max_ongoing_requests=64, ray_actor_options={"num_cpus": 0.5})
@serve.ingress()
class Ingress:
    async def __init__(self, embedder: DeploymentHandle, memorizer: DeploymentHandle, settings: dict | None = None):
        self.settings = Settings(**(settings or {}))
        tracing.configure(self.settings, "Ingress")
        self.embedder = embedder
        self.memorizer = memorizer
        self.pokes: set[asyncio.Task] = set()
        stores = await Stores.connect(self.settings, redis_observer=RedisConfirmMetrics())
        # The first replica on a machine builds the traced encoder in a subprocess (seconds): off the loop.
        encoder = (
            await asyncio.to_thread(load_query_encoder, self.settings.embedding_model, self.settings.embedding_int8)
            if self.settings.query_embedding == "local"
            else None
        )
        self.deps = Dependencies(
            settings=self.settings,
            stores=stores,
            embed_one=encoder.encode_one if encoder is not None else self._embed_one,
            embed_documents=self._embed_documents,
            compact_now=self._compact_now,
            keyring=self.settings.keyring(),
            signer=self.settings.inspector_signer(),
            poke=self._poke if self.settings.memorizer_poke else None,
            observers=IngressMetrics(),
            llm=llm_client(self.settings),
        )
        logger.info("ingress settings: %s", self.settings.redacted())
        # What the replica loaded to start (torch, the model, Ray, pydantic) lives as long as it does:
        # out of the collector's sight, a full collection walks only what requests left behind.
        gc.freeze()

    def __serve_build_asgi_app__(self) -> FastAPI:
        """Serve calls this once the constructor ran: the app is this replica's, with its state."""
        app = create_http_app(self.deps)
        if tracing.enabled():
            app.add_middleware(ServeRequestIds)
        return app

    async def _embed_one(self, text: str) -> list[float]:
        return await self.embedder.embed_one.remote(text, tracing.carrier())

    async def _embed_documents(self, texts: list[str], plain: list[bool] | None = None) -> list[list[float]]:
        return await self.embedder.embed_many.remote(texts, plain, tracing.carrier())

    async def _compact_now(self, tenant: str, session: str) -> dict:
        try:
            outcome = await self.memorizer.compress.remote(tenant, session, tracing.carrier())
        except RayTaskError as exc:  # a failure of the memorizer's, as its own exception type
            raise exc.as_instanceof_cause() from None
        if isinstance(outcome, ServiceError):  # its refusal comes back as a value (Memorizer.compress)
            raise outcome
        return outcome

    def _poke(self, tenant: str, session_id: str) -> None:
        context = tracing.carrier()  # the write's: the memorizer links the pass it starts to it

        async def send() -> None:
            try:
                await self.memorizer.poke.remote(tenant, session_id, context)
            except Exception as exc:  # the sweep picks the session up from the pending set
                logger.warning("memorizer poke failed: %r", exc)

        task = asyncio.create_task(send())
        self.pokes.add(task)
        task.add_done_callback(self.pokes.discard)

    async def __del__(self):
        if hasattr(self, "deps"):
            await self.deps.stores.close()
