"""Embedder deployment: all-MiniLM-L6-v2 on CPU with `@serve.batch` for concurrent single texts."""

from __future__ import annotations

from ray import serve
from ray.util import metrics

from serve_app.encoding.documents import load_document_encoder
from serve_app.encoding.sentence import PassEncoder, SentenceEncoder
from serve_app.runtime import tracing
from serve_app.runtime.priority import lower_priority
from serve_app.settings import Settings

PASSES_AT_ONCE = 2
"""Forward passes a replica runs at once, one torch thread each, whether they come from one batch or
from two: two cores busy on two passes spend less CPU than both on one pass, whose two threads wait
for each other after every operator (docs/benchmarks/encode_documents.md). `max_ongoing_requests`
holds this many full batches."""


@serve.deployment(name="Embedder", max_ongoing_requests=64, ray_actor_options={"num_cpus": 0.5})
class Embedder:
    def __init__(self, settings: dict | None = None):
        self.settings = Settings(**(settings or {}))
        tracing.configure(self.settings, "Embedder")
        queries_here = self.settings.query_embedding == "deployment"
        if not queries_here:  # no caller waits on this replica
            lower_priority(self.settings.background_nice)
        # Where queries are embedded here, sentence-transformers with its one-text trace; else the
        # traced batch model alone, which keeps transformers out of this process (the memorizer
        # sends batches).
        self.encoder: PassEncoder
        if queries_here:
            self.encoder = SentenceEncoder(
                self.settings.embedding_model, threads=1, int8=self.settings.embedding_int8, workers=PASSES_AT_ONCE
            )
        else:
            self.encoder = load_document_encoder(self.settings.embedding_model, self.settings.embedding_int8, PASSES_AT_ONCE)
        for batched in (self._embed_texts, self._embed_lists):
            batched.set_max_batch_size(self.settings.embedder_max_batch_size)
            batched.set_batch_wait_timeout_s(self.settings.embedder_batch_wait_s)
        self.batch_size = metrics.Histogram(
            "memserve_embedder_batch_size", "Texts per forward pass.", boundaries=[1, 2, 4, 8, 16, 32, 64, 128]
        )

    async def embed_one(self, text: str, trace: tracing.Carrier | None = None) -> list[float]:
        """One text per caller; concurrent callers are encoded together in one forward pass."""
        with tracing.span("Embedder.embed_one", kind="server", parent=trace):
            return await self._embed_texts((text, tracing.current_link()))

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.01, max_concurrent_batches=PASSES_AT_ONCE)
    async def _embed_texts(self, items: list[tuple[str, list]]) -> list[list[float]]:
        texts = [text for text, _ in items]
        self.batch_size.observe(len(texts))
        # The batch serves many callers: a trace of its own, linked to each caller's span.
        with tracing.span("Embedder.forward", root=True, links=[link for _, links in items for link in links]) as span:
            span.set_attribute("memserve.batch_size", len(texts))
            return await self.encoder.encode_async(texts)

    async def embed_many(
        self, texts: list[str], plain: list[bool] | None = None, trace: tracing.Carrier | None = None
    ) -> list[list[float]]:
        """Memories' vectors (`PassEncoder.encode_documents`) of a caller's own batch (one
        session's new turns), encoded together with the batches of the callers that arrive
        meanwhile: the memorizer runs many sessions at once, each with a few turns, and one forward
        pass over all of them costs less than one each (bench/embedder_batching.py)."""
        if not texts:
            return []
        with tracing.span("Embedder.embed_many", kind="server", parent=trace, attributes={"memserve.texts": len(texts)}):
            return await self._embed_lists((texts, plain or [False] * len(texts), tracing.current_link()))

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.01, max_concurrent_batches=PASSES_AT_ONCE)
    async def _embed_lists(self, lists: list[tuple[list[str], list[bool], list]]) -> list[list[list[float]]]:
        flat = [text for texts, _, _ in lists for text in texts]
        self.batch_size.observe(len(flat))
        links = [link for _, _, caller in lists for link in caller]
        with tracing.span("Embedder.forward", root=True, links=links) as span:
            span.set_attribute("memserve.batch_size", len(flat))
            vectors = await self.encoder.encode_documents_async(flat, [flag for _, plain, _ in lists for flag in plain])
        out, start = [], 0
        for texts, _, _ in lists:
            out.append(vectors[start : start + len(texts)])
            start += len(texts)
        return out
