"""Batching where batches happen: the memorizer's embedding of appended turns through the Embedder.

    python -m bench.embedder_batching --seconds 10

With the shipped `query_embedding: local`, the Embedder serves only the memorizer: each pass over a
session sends that session's new turns as one `embed_many` call (up to `memorizer_batch_size`), and
the sweep runs the pending sessions concurrently. Starts its own Ray, deploys the Embedder with the
shipped settings (one replica), and drives `embed_many` through its handle the way the memorizer
does: one caller with batches of 1 to 64 turns (a single busy session), and 8 or 32 concurrent
callers with 2 turns each (many sessions, a few new turns each, as under bench.load's append). Turn
texts are LoCoMo turns. Prints turns embedded per second and the call's p50.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from bench.locomo_data import turns_of
from serve_app.deployments.embedder import Embedder
from serve_app.settings import Settings

SHAPES = (
    ("1 caller", 1, 1),
    ("1 caller", 1, 8),
    ("1 caller", 1, 32),
    ("1 caller", 1, 64),
    ("8 callers", 8, 2),
    ("32 callers", 32, 2),
)


async def drive(handle, texts: list[str], callers: int, batch: int, seconds: float) -> dict[str, float]:
    latencies: list[float] = []
    embedded = 0
    deadline = time.perf_counter() + seconds

    async def caller(index: int) -> None:
        nonlocal embedded
        n = index * 1000
        while time.perf_counter() < deadline:
            chunk = [texts[(n + j) % len(texts)] for j in range(batch)]
            started = time.perf_counter()
            await handle.embed_many.remote(chunk)
            latencies.append((time.perf_counter() - started) * 1000)
            embedded += batch
            n += batch

    started = time.perf_counter()
    await asyncio.gather(*(caller(i) for i in range(callers)))
    elapsed = time.perf_counter() - started
    return {"turns_per_s": embedded / elapsed, "call_p50_ms": statistics.median(latencies)}


async def measure(texts: list[str], seconds: float) -> dict[str, dict]:
    from ray import serve

    handle = serve.run(Embedder.bind(Settings().model_dump(mode="json")), name="embedder-bench", route_prefix=None)
    await drive(handle, texts, 8, 8, 2.0)  # warm-up
    results = {}
    for label, callers, batch in tqdm(SHAPES, desc="shapes", unit="shape"):
        results[f"{label}, {batch} turns per call"] = await drive(handle, texts, callers, batch, seconds)
    serve.delete("embedder-bench")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="Directory of LoCoMo files (turn texts).")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", dest="json_out", default="bench/out/embedder_batching.json")
    args = parser.parse_args()
    texts = [t.content for path in sorted(args.data.glob("*.json")) for t in turns_of(json.loads(path.read_text()))]
    import ray

    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=tempfile.mkdtemp(prefix="memserve-embed-"))
    try:
        results = asyncio.run(measure(texts, args.seconds))
    finally:
        ray.shutdown()
    single = results["1 caller, 1 turns per call"]["turns_per_s"]
    print(f"\n{'embed_many':<34}{'turns/s':>10}{'x 1 turn':>10}{'call p50 ms':>13}")
    for label, row in results.items():
        print(f"{label:<34}{row['turns_per_s']:>10.1f}{row['turns_per_s'] / single:>10.2f}{row['call_p50_ms']:>13.1f}")
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
