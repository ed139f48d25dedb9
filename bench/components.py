"""Each part of the service alone, in process, against real embedded backends (no HTTP, no Serve).

    python -m bench.components --memories 10000 --ops 300

Starts its own Redis, PostgreSQL and Milvus Lite (the launchers of `memserve up`) in a temp dir,
loads --memories vectors for one user among --other-users, then times each operation sequentially:
p50, p99 and QPS (1 / mean latency at concurrency 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
from tqdm import tqdm

from bench.common import percentile
from serve_app.core.compression import SummaryState, extractive_summary, plan_compaction
from serve_app.core.records import MemoryRow
from serve_app.core.tokenizer import count_tokens
from serve_app.embedded.launchers import EmbeddedBackends, Ports
from serve_app.encoding.query import load_query_encoder
from serve_app.services.compaction import history_tokens
from serve_app.settings import Settings
from serve_app.stores.facts import FactStore
from serve_app.stores.keyword_index import KeywordIndex
from serve_app.stores.session_log import SessionLog
from serve_app.stores.vectors import VectorStore

# Stemmed-looking words for the keyword index: frequencies vary, like a real conversation's.
_VOCABULARY = (
    "order,invoic,ship,deliveri,refund,account,password,meet,calendar,project,deadlin,budget,report,team,"
    "travel,flight,hotel,book,restaur,dinner,famili,kid,school,paint,music,guitar,concert,run,marathon,yoga,"
    "doctor,appoint,medicin,garden,plant,dog,cat,puppi,adopt,beach,camp,hike,mountain,lake,photo,friend,"
    "birthday,parti,gift,cake,job,interview,promot,salari,car,repair,insur,bank,loan,rent,apart,move,citi"
)


async def timed(label: str, n: int, op) -> dict:
    samples = []
    for i in tqdm(range(n), desc=label, unit="op", leave=False):
        started = time.perf_counter()
        await op(i)
        samples.append((time.perf_counter() - started) * 1000)
    mean = statistics.fmean(samples)
    return {"p50_ms": percentile(samples, 50), "p99_ms": percentile(samples, 99), "qps": 1000 / mean}


def unit_vectors(n: int, dim: int, seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, dim)).astype("float32")
    return v / np.linalg.norm(v, axis=1, keepdims=True)


async def run(args) -> dict:
    data = Path(tempfile.mkdtemp(prefix="memserve-bench-"))
    backends = EmbeddedBackends(data, Ports.free()).start()
    try:
        env = backends.env
        log = SessionLog(env["REDIS_URL"], 3600)
        facts = await FactStore.connect(env["POSTGRES_DSN"])
        vectors = await asyncio.to_thread(VectorStore, env["MILVUS_URI"], "bench", 384)
        keywords = KeywordIndex(facts.pool)
        encoder = load_query_encoder(int8=Settings().embedding_int8)  # as the ingress embeds queries
        words = [t.split()[0] for t in _VOCABULARY.split(",")]

        user = "bench-user"
        print(f"loading {args.memories} memories for {user} and {args.other_users} x {args.memories // 4} for others…")
        owners = [(user, args.memories)] + [(f"other-{i}", args.memories // 4) for i in range(args.other_users)]
        for owner, count in owners:
            vecs = unit_vectors(count, 384, hash(owner) % 2**32)
            for start in tqdm(range(0, count, 1000), desc=f"load {owner}", leave=False):
                rows = [
                    MemoryRow(
                        f"{owner}-{i}",
                        "local",
                        owner,
                        f"s-{i // 100}",
                        i,
                        "user",
                        "turn",
                        " ".join(words[(i * 7 + j * 13) % len(words)] for j in range(12)),
                        i,
                        vecs[i].tolist(),
                    )
                    for i in range(start, min(count, start + 1000))
                ]
                await vectors.upsert(rows)
                await keywords.upsert(rows)
        await vectors.flush()  # as the memorizer does on its timer
        await facts.pool.execute("ANALYZE memory_postings; ANALYZE memory_keywords")  # as autovacuum does soon after

        session = "bench-" + uuid.uuid4().hex[:6]
        await log.append("local", session, user, [{"role": "user", "content": f"warm-up turn {i}"} for i in range(50)])
        for i in range(20):
            await facts.put("local", user, f"key_{i}", f"value {i}", "fact")
        queries = unit_vectors(args.ops, 384, 7)
        dialog = [
            {
                "seq": i + 1,
                "role": "user" if i % 2 == 0 else "assistant",
                "content": f"Order ORD-{1000 + i} costs ${i}.50 on 2024-05-{i % 28 + 1:02d}.",
            }
            for i in range(100)
        ]
        n = args.ops
        results = {
            "store message": await timed(
                "store message", n, lambda i: log.append("local", session, user, [{"role": "user", "content": f"m{i}"}])
            ),
            "get history (50 turns)": await timed("get history", n, lambda i: log.read("local", session, after=0, limit=50)),
            "vector store (1 row)": await timed(
                "vector store",
                n,
                lambda i: vectors.upsert(
                    [MemoryRow(f"new-{i}", "local", user, "s-new", i, "user", "turn", "x", 0, queries[i].tolist())]
                ),
            ),
            f"vector recall ({args.memories} for user)": await timed(
                "vector recall", n, lambda i: vectors.search_dense("local", user, queries[i].tolist(), limit=10)
            ),
            f"keyword recall (BM25, {args.memories} for user)": await timed(
                "keyword recall", n, lambda i: keywords.search("local", user, " ".join(words[i % 50 : i % 50 + 4]), limit=50)
            ),
            "fact store": await timed("fact store", n, lambda i: facts.put("local", user, f"k{i % 50}", f"v{i}", "fact")),
            "fact query (current)": await timed("fact query", n, lambda i: facts.current("local", user)),
            "query embedding (batch 1)": await timed("embedding", n, lambda i: encoder.encode_one(f"where is order {i}?")),
        }

        async def compress(_: int) -> None:
            target = plan_compaction(dialog, history_tokens(dialog), trigger_tokens=0, keep_rounds=2, force=True)
            extractive_summary(
                SummaryState(), [t for t in dialog if t["seq"] <= target], target, max_tokens=512, count_tokens=count_tokens
            )

        results["compression (100 turns, extractive)"] = await timed("compression", max(20, n // 10), compress)
        await asyncio.gather(log.close(), facts.close(), vectors.close())
        return results
    finally:
        backends.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--other-users", type=int, default=4)
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--json", dest="json_out", default="bench/out/components.json")
    args = parser.parse_args()
    results = asyncio.run(run(args))
    print(f"\n{'operation':<40}{'p50 ms':>9}{'p99 ms':>9}{'QPS':>9}")
    for name, row in results.items():
        print(f"{name:<40}{row['p50_ms']:>9.2f}{row['p99_ms']:>9.2f}{row['qps']:>9.0f}")
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
