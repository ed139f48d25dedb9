"""The Embedder deployment with `@serve.batch` against the same deployment with max_batch_size=1.

    python -m bench.embedder_batching --seconds 10

Starts its own Ray, deploys the Embedder twice with identical settings except the batch size
(one replica each, the same fractional CPU), then drives each through its handle with closed-loop
callers at concurrency 1 and 32 (one short query-like text per call, as the ingress sends).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from deployments.embedder import Embedder
from serve_app.settings import Settings

TEXTS = [f"What did the user say about order ORD-{i} and the delivery on day {i % 28 + 1}?" for i in range(512)]


async def drive(handle, concurrency: int, seconds: float) -> dict[str, float]:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def caller(index: int) -> None:
        n = index
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            await handle.embed_one.remote(TEXTS[n % len(TEXTS)])
            latencies.append((time.perf_counter() - started) * 1000)
            n += concurrency

    started = time.perf_counter()
    await asyncio.gather(*(caller(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - started
    return {"throughput": len(latencies) / elapsed, "p50_ms": statistics.median(latencies)}


async def measure(seconds: float) -> dict[str, dict]:
    from ray import serve

    results: dict[str, dict] = {}
    batched = Settings().embedder_max_batch_size
    for label, batch in ((f"max_batch_size={batched}", batched), ("max_batch_size=1", 1)):
        settings = Settings(embedder_max_batch_size=batch).model_dump(mode="json")
        name = f"embedder-b{batch}"
        handle = serve.run(Embedder.options(name=f"Embedder{batch}").bind(settings), name=name, route_prefix=None)
        await drive(handle, 32, 2.0)  # warm-up
        results[label] = {f"c{c}": await drive(handle, c, seconds) for c in (1, 32)}
        serve.delete(name)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", dest="json_out", default="bench/out/embedder_batching.json")
    args = parser.parse_args()
    import ray

    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=tempfile.mkdtemp(prefix="memserve-embed-"))
    try:
        results = asyncio.run(measure(args.seconds))
    finally:
        ray.shutdown()
    print(f"\n{'Embedder':<30}{'c':>4}{'texts/s':>10}{'p50 ms':>9}")
    for label, rows in results.items():
        for c, row in rows.items():
            print(f"{label:<30}{c[1:]:>4}{row['throughput']:>10.1f}{row['p50_ms']:>9.1f}")
    batched, unbatched = (rows["c32"]["throughput"] for rows in results.values())
    ratio = batched / unbatched
    print(f"throughput at concurrency 32, batched / unbatched: {ratio:.2f}x (target >= 2.5x)")
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"results": results, "ratio_c32": ratio}, indent=2))


if __name__ == "__main__":
    main()
