"""Each part of the service alone, in process, against real embedded backends (no HTTP, no Serve),
measured the way a request uses it.

    python -m bench.components ../shared/data/locomo --memories 10000 --ops 300

Starts its own Redis, PostgreSQL and Milvus Lite (the launchers of `memserve up`) in a temp dir and
stores --memories memories for one user among --other-users: the measured user's memories are LoCoMo
turns embedded by the service's own model (int8, as shipped), so vector search runs over real text
embeddings; the other users' rows carry random unit vectors. Queries are LoCoMo questions, each used
once per part. Each part runs with the arguments the request path gives it: dense search returns ids
for `recall_candidates` (100) hits, BM25 scores the normalized question for 100, the winners' details
are one fetch, the budget fits each question's own memories with the history and the facts. Every
part reports p50 and p99 at concurrency 1 and its throughput at concurrency 32 (what bench.load
divides by: one client's QPS says nothing about 32 of them), and the CPU one call takes at
concurrency 1: in this process (what the ingress pays for it) and in the backends' processes. On a
machine of few cores, CPU per call is what bounds throughput, whatever overlaps in time.
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
import psutil
from tqdm import tqdm

from bench.common import percentile
from bench.locomo_data import questions_of, turns_of
from bench.memory import cpu_s
from serve_app.core.budget import ContextRequest, build_context
from serve_app.core.compression import SummaryState, extractive_summary, plan_compaction
from serve_app.core.keywords import memory_keywords, query_terms
from serve_app.core.ranking import Scored, fuse
from serve_app.core.records import MemoryRow
from serve_app.core.rerank import rerank
from serve_app.core.tokenizer import count_tokens
from serve_app.embedded.launchers import EmbeddedBackends, Ports
from serve_app.encoding.query import load_query_encoder
from serve_app.encoding.sentence import SentenceEncoder
from serve_app.services.compaction import history_tokens
from serve_app.services.context import fact_line, memory_item
from serve_app.services.recall import fusion_params
from serve_app.settings import Settings
from serve_app.stores.facts import FactStore
from serve_app.stores.keyword_index import KeywordIndex
from serve_app.stores.session_log import SessionLog
from serve_app.stores.vectors import VectorStore

CONCURRENCY = 32
TENANT = "local"


def backend_cpu_s(backends: EmbeddedBackends) -> float:
    """CPU seconds the backends have used so far, their children too (a PostgreSQL connection is a
    process of its own)."""
    total = 0.0
    for backend in backends.backends.values():
        try:
            root = psutil.Process(backend.process.pid)
            total += sum(cpu_s(proc) for proc in [root, *root.children(recursive=True)])
        except psutil.Error:
            continue
    return total


async def settle(backends: EmbeddedBackends, longest_s: float, idle_share: float = 0.05) -> None:
    """Wait until the backends use under `idle_share` of a core over a second, or `longest_s`."""
    deadline = time.monotonic() + longest_s
    while time.monotonic() < deadline:
        before = backend_cpu_s(backends)
        await asyncio.sleep(1.0)
        if backend_cpu_s(backends) - before < idle_share:
            return


async def timed(backends: EmbeddedBackends | None, label: str, n: int, op) -> dict:
    """p50/p99 and CPU per call at concurrency 1, then the throughput of CONCURRENCY closed-loop callers."""
    samples = []
    own_cpu, their_cpu = time.process_time(), backend_cpu_s(backends) if backends else 0.0
    for i in tqdm(range(n), desc=f"{label} (c=1)", unit="op", leave=False):
        started = time.perf_counter()
        await op(i)
        samples.append((time.perf_counter() - started) * 1000)
    cpu = {
        "caller_cpu_ms": 1000 * (time.process_time() - own_cpu) / n,
        "backend_cpu_ms": 1000 * (backend_cpu_s(backends) - their_cpu) / n if backends else 0.0,
    }
    counter = iter(range(n, 3 * n))
    done = 0

    async def caller() -> None:
        nonlocal done
        for i in counter:
            await op(i)
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(CONCURRENCY)))
    seconds = time.perf_counter() - started
    return {"p50_ms": percentile(samples, 50), "p99_ms": percentile(samples, 99), "qps_c32": done / seconds, **cpu}


def unit_vectors(n: int, dim: int, seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, dim)).astype("float32")
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _nth(pool: list[str], i: int) -> str:
    """The i-th of a pool taken round and round, marked on each round after the first so every one differs."""
    return pool[i % len(pool)] + ("" if i < len(pool) else f" ({i // len(pool)})")


def _row(owner: str, i: int, text: str, vector: list[float], settings: Settings) -> MemoryRow:
    return MemoryRow(
        id=f"{owner}-{i}",
        tenant_id=TENANT,
        user_id=owner,
        session_id=f"s-{i // 100}",
        seq=i,
        role="user",
        kind="turn",
        text=text,
        created_at_ms=1_700_000_000_000 + i,
        vector=vector,
        keywords=memory_keywords(text, weight=settings.recall_keyword_self_weight),
    )


async def run(args) -> dict:
    settings = Settings()
    turns, questions = [], []
    for path in sorted(args.data.glob("*.json")):
        data = json.loads(path.read_text())
        turns += [t.content for t in turns_of(data)]
        questions += [q.text for q in questions_of(data)]
    texts = [turns[i % len(turns)] + ("" if i < len(turns) else f" ({i // len(turns)})") for i in range(args.memories)]
    queries = [
        questions[i % len(questions)] + ("" if i < len(questions) else f" ({i // len(questions)})") for i in range(3 * args.ops)
    ]
    print(f"embedding {len(texts)} LoCoMo turns with the shipped model…")
    encoder = SentenceEncoder(int8=settings.embedding_int8, trace_single=False)
    vectors_of_user = []
    for start in tqdm(range(0, len(texts), 256), desc="embed", leave=False):
        vectors_of_user += await encoder.encode_documents_async(texts[start : start + 256])
    query_encoder = load_query_encoder(int8=settings.embedding_int8)  # as the ingress embeds queries
    query_vectors = [await query_encoder.encode_one(q) for q in tqdm(queries, desc="embed queries", leave=False)]

    data = Path(tempfile.mkdtemp(prefix="memserve-bench-"))
    backends = EmbeddedBackends(data, Ports.free()).start()
    try:
        env = backends.env
        log = SessionLog(env["REDIS_URL"], 3600)
        facts = await FactStore.connect(env["POSTGRES_DSN"])
        vectors = await asyncio.to_thread(VectorStore, env["MILVUS_URI"], "bench", settings.embedding_dim)
        keywords = KeywordIndex(facts.pool)
        user = "bench-user"
        print(f"storing {args.memories} memories for {user} and {args.other_users} x {args.memories // 4} for others…")
        owners = [(user, args.memories)] + [(f"other-{i}", args.memories // 4) for i in range(args.other_users)]
        for owner, count in owners:
            random = unit_vectors(count, settings.embedding_dim, hash(owner) % 2**32)
            for start in tqdm(range(0, count, 1000), desc=f"store {owner}", leave=False):
                rows = [
                    _row(owner, i, texts[i % len(texts)], vectors_of_user[i] if owner == user else random[i].tolist(), settings)
                    for i in range(start, min(count, start + 1000))
                ]
                await vectors.upsert(rows)
                await keywords.upsert(rows)
        await vectors.flush()  # as the memorizer does on its timer
        await facts.pool.execute("ANALYZE memory_postings; ANALYZE memory_keywords")  # as autovacuum does soon after
        # Milvus Lite compacts, and PostgreSQL vacuums, what was just loaded: their CPU would count
        # against the first parts measured.
        await settle(backends, args.settle_s)

        session = "bench-" + uuid.uuid4().hex[:6]
        await log.append(TENANT, session, user, [{"role": "user", "content": f"warm-up turn {i}"} for i in range(50)])
        for i in range(20):
            await facts.put(TENANT, user, f"key_{i}", f"value {i}", "fact")
        dialog = [
            {
                "seq": i + 1,
                "role": "user" if i % 2 == 0 else "assistant",
                "content": f"Order ORD-{1000 + i} costs ${i}.50 on 2024-05-{i % 28 + 1:02d}.",
            }
            for i in range(100)
        ]
        candidates, top_k = settings.recall_candidates, settings.recall_top_k
        winners = [f"{user}-{i}" for i in range(top_k)]
        n = args.ops
        results = {
            "store message": await timed(
                backends, "store message", n, lambda i: log.append(TENANT, session, user, [{"role": "user", "content": f"m{i}"}])
            ),
            "get history (50 turns)": await timed(
                backends, "get history", n, lambda i: log.read(TENANT, session, after=0, limit=50)
            ),
            "query embedding (batch 1)": await timed(backends, "embedding", n, lambda i: query_encoder.encode_one(queries[i])),
            f"vector recall ({candidates} ids of {args.memories})": await timed(
                backends,
                "vector recall",
                n,
                lambda i: vectors.search_dense_ids(TENANT, user, query_vectors[i], limit=candidates),
            ),
            f"keyword recall (BM25, {candidates} of {args.memories})": await timed(
                backends, "keyword recall", n, lambda i: keywords.search(TENANT, user, query_terms(queries[i]), limit=candidates)
            ),
            f"winner details ({top_k} ids)": await timed(backends, "details", n, lambda i: keywords.fetch(TENANT, user, winners)),
            "fact query (current)": await timed(backends, "fact query", n, lambda i: facts.current(TENANT, user)),
            "fact store": await timed(
                backends, "fact store", n, lambda i: facts.put(TENANT, user, f"k{i % 50}", f"v{i}", "fact")
            ),
            "vector store (1 row)": await timed(
                backends,
                "vector store",
                n,
                lambda i: vectors.upsert([_row(user, 100_000 + i, f"new memory {i}", query_vectors[i % n], settings)]),
            ),
        }

        async def compress(_: int) -> None:
            target = plan_compaction(dialog, history_tokens(dialog), trigger_tokens=0, keep_rounds=2, force=True)
            extractive_summary(
                SummaryState(), [t for t in dialog if t["seq"] <= target], target, max_tokens=512, count_tokens=count_tokens
            )

        results["compression (100 turns, extractive)"] = await timed(backends, "compression", max(20, n // 10), compress)

        # The budget over what recall hands it: each question's own best memories (the keyword side's,
        # which carry their text), the 50-turn history and the facts, at 4,096 tokens.
        recalled = [await keywords.search(TENANT, user, query_terms(q), limit=top_k) for q in queries]
        history = dialog[:50]
        current = [fact_line(f) for f in await facts.current(TENANT, user)]

        async def budget(i: int) -> None:
            build_context(
                ContextRequest(
                    max_tokens=4096,
                    shares=settings.shares,
                    turns=history,
                    facts=current,
                    memories=[memory_item(h) for h in recalled[i]],
                )
            )

        results[f"context budget ({top_k} memories, 4,096 tokens)"] = await timed(backends, "budget", n, budget)

        # The second stage over what each question's searches and fusion keep, with their details,
        # as recall hands them over (services/recall.py).
        params = fusion_params(settings)
        staged = []
        for i, query in enumerate(queries):
            dense = [Scored(m, s) for m, s, _ in await vectors.search_dense_ids(TENANT, user, query_vectors[i], limit=candidates)]
            found = await keywords.search(TENANT, user, query_terms(query), limit=candidates)
            keyword = [Scored(h.id, h.score, None, h.coverage) for h in found]
            kept = fuse(dense, keyword, params)
            details = {h.id: h for h in found} | {h.id: h for h in await keywords.fetch(TENANT, user, [f.id for f in kept])}
            staged.append(([f for f in kept if f.id in details], dense, keyword, details))
        kept_mean = statistics.fmean(len(s[0]) for s in staged)

        async def second_stage(i: int) -> None:
            rerank(*staged[i])

        results[f"second-stage ranking ({kept_mean:.0f} candidates)"] = await timed(backends, "rerank", n, second_stage)
        await asyncio.gather(log.close(), facts.close(), vectors.close())
        return results
    finally:
        backends.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="Directory of LoCoMo files (memory texts and queries).")
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--other-users", type=int, default=4)
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--settle-s", type=float, default=60, help="Longest wait for the backends to go idle after loading.")
    parser.add_argument("--json", dest="json_out", default="bench/out/components.json")
    args = parser.parse_args()
    results = asyncio.run(run(args))
    print(f"\n{'operation':<40}{'p50 ms':>9}{'p99 ms':>9}{'c=32 QPS':>10}{'CPU ms: caller':>16}{'backends':>10}")
    for name, row in results.items():
        print(
            f"{name:<40}{row['p50_ms']:>9.2f}{row['p99_ms']:>9.2f}{row['qps_c32']:>10.0f}"
            f"{row['caller_cpu_ms']:>16.2f}{row['backend_cpu_ms']:>10.2f}"
        )
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
