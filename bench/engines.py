"""Dense search on the two embedded Milvus engines, the same data, one run.

    python -m bench.engines --memories 10000 --others 100000

Starts Milvus Lite and the Milvus standalone server (the launchers `memserve up` uses) side by side,
loads into each the same rows: one user's `--memories` texts from `bench.scale.memory_texts`,
embedded by the service's model, and `--others` rows of other users with synthetic unit vectors.
Then the search each recall makes (`VectorStore.search_dense_ids`, the recall's candidate count),
for distinct questions from `bench.scale.queries` embedded beforehand, sequentially, on each engine
in turn. The store's own call, not HTTP: `bench.scale` measures the whole request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
from tqdm import tqdm

from bench.common import percentile
from bench.scale import memory_texts, queries
from serve_app.core.records import MemoryRow
from serve_app.embedded.launchers import milvus_starter
from serve_app.embedded.ports import free_port
from serve_app.settings import Settings
from serve_app.stores.vectors import VectorStore

USER, TENANT = "engine-bench-user", "engine-bench"


def rows_of(user_vectors: np.ndarray, texts: list[str], others: int, seed: int) -> list[MemoryRow]:
    rng = np.random.default_rng(seed)
    synthetic = rng.standard_normal((others, user_vectors.shape[1])).astype("float32")
    synthetic /= np.linalg.norm(synthetic, axis=1, keepdims=True)
    mine = [
        MemoryRow(f"me-{i}", TENANT, USER, f"me-s{i // 500}", i % 500 + 1, "user", "turn", t, i, v.tolist())
        for i, (t, v) in enumerate(zip(texts, user_vectors, strict=True))
    ]
    theirs = [
        MemoryRow(f"o-{i}", TENANT, f"other-{i % 1000}", f"o-s{i // 500}", i % 500 + 1, "user", "turn", f"row {i}", i, v.tolist())
        for i, v in enumerate(synthetic)
    ]
    return mine + theirs


async def load(uri: str, rows: list[MemoryRow], dim: int) -> VectorStore:
    store = await asyncio.to_thread(VectorStore, uri, "engine_bench", dim)
    for start in tqdm(range(0, len(rows), 2000), desc=f"load {uri}", unit="chunk", leave=False):
        await store.upsert(rows[start : start + 2000])
    await store.flush()  # as bench.scale's loader does: both engines then search sealed segments
    return store


async def timed_searches(store: VectorStore, vectors: np.ndarray, limit: int) -> list[float]:
    for vector in vectors[:20]:  # warm-up, not counted (its queries are not reused below)
        await store.search_dense_ids(TENANT, USER, vector.tolist(), limit=limit)
    samples = []
    for vector in tqdm(vectors[20:], desc="search", unit="q", leave=False):
        started = time.perf_counter()
        await store.search_dense_ids(TENANT, USER, vector.tolist(), limit=limit)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def run(args) -> dict:
    from serve_app.encoding.sentence import SentenceEncoder

    settings = Settings()
    encoder = SentenceEncoder(threads=1, int8=settings.embedding_int8)
    texts = memory_texts(args.memories, args.seed)
    user_vectors = np.asarray(await encoder.encode_documents_async(texts), dtype="float32")
    asked = np.asarray(await encoder.encode_async(queries(args.queries + 20, args.seed + 7)), dtype="float32")
    rows = rows_of(user_vectors, texts, args.others, args.seed)
    results = {}
    with tempfile.TemporaryDirectory(prefix="engines-") as scratch:
        for engine in ("lite", "server"):
            backend = milvus_starter(engine)(Path(scratch) / engine, free_port())
            try:
                store = await load(backend.url, rows, user_vectors.shape[1])
                await asyncio.sleep(args.settle_s)  # let the server build its index on the sealed segments
                samples = await timed_searches(store, asked, settings.recall_candidates)
                await store.close()
                root = psutil.Process(backend.process.pid)
                pss = sum(p.memory_full_info().pss for p in [root, *root.children(recursive=True)]) / 2**20
                results[engine] = {
                    "p50_ms": percentile(samples, 50),
                    "p95_ms": percentile(samples, 95),
                    "p99_ms": percentile(samples, 99),
                    "pss_mib": pss,
                    "searches": len(samples),
                }
            finally:
                backend.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memories", type=int, default=10_000, help="the measured user's memories")
    parser.add_argument("--others", type=int, default=100_000, help="other users' rows (synthetic vectors)")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--settle-s", type=float, default=15.0)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--json-out", type=Path, default=Path("bench/out/engines.json"))
    args = parser.parse_args()
    results = asyncio.run(run(args))
    print(f"dense search, {args.memories} memories of one user among {args.others} other rows, {args.queries} distinct queries")
    print(f"{'engine':<8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'PSS MiB':>9}")
    for engine, r in results.items():
        print(f"{engine:<8} {r['p50_ms']:>8.2f} {r['p95_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['pss_mib']:>9.0f}")
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps({"results": results, "args": vars(args)}, indent=2, default=str))


if __name__ == "__main__":
    main()
