"""The scale curve: context and memory search as one user's memories grow, among other users' rows.

    python -m bench.scale --url http://127.0.0.1:8000 --data-dir .memserve --sizes 1000 10000 100000

Against a running `memserve up`, over HTTP, shipped defaults. For each size the measured user is
grown to that many memories: texts from `memory_texts` (a seeded, offline generator of varied
sentences: eight forms over people, actions, things, places, reasons, dates, amounts and ticket ids), appended as turns and
embedded by the service itself. Before the first size, `--others` rows of other users go straight
into the stores with synthetic vectors (random unit vectors; the issue allows it): they make the
collection and the postings table as large as a shared deployment's, and no request of the
measured user may touch them.

At each size: context (`POST /v1/context`, 4,096 tokens, a 20-turn session) and memory search,
sequential, `--requests` each; then context at concurrency 32 for `--seconds`. Every query is
distinct within the run (`queries`, the same generator phrased as questions). The service keeps no
result cache: each request embeds its query and searches both indexes. Prints a table, writes JSON
and a PNG, and the PSS of `memserve up`'s processes after the run.

Beside each window, the CPU its requests took in each of the service's processes (found through
`--data-dir`): their sum is what a request costs the machine, so the cores carry at most
cores x 1000 / (CPU ms per request) requests a second, at any concurrency. After loading a size it
waits until the service takes less than `--idle-ms-per-s` of CPU (the wait is printed), so what a
load leaves behind (the Milvus server compacts new segments for minutes) is not counted in the
requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

import aiohttp
import httpx
import psutil
from tqdm import tqdm

from bench.common import percentile, wait_memorized
from bench.load import CLIENT, Load, cpu_mark, cpu_per_request, cpu_seconds, run_window, service_cpu_used
from bench.memory import measure
from bench.search_latency import timed

PEOPLE = (
    "Ana", "Bilal", "Chen", "Dara", "Emeka", "Farah", "Goran", "Hana", "Ivo", "Jun", "Kofi", "Lena", "Mateo", "Nia", "Omar",
    "Priya", "Quinn", "Rosa", "Sven", "Tariq", "Uma", "Viktor", "Wen", "Ximena", "Yusuf", "Zoe", "Aiko", "Bruno", "Celine",
    "Dmitri", "Elif", "Felix", "Greta", "Hugo", "Ines", "Jonas", "Kira", "Luca", "Mina", "Nils",
)  # fmt: skip
ACTIONS = (
    "booked", "cancelled", "repaired", "ordered", "returned", "painted", "borrowed", "sold", "insured", "shipped",
    "renewed", "assembled", "reviewed", "cleaned", "replaced", "moved", "photographed", "measured", "tested", "packed",
    "rented", "upgraded", "lost", "found", "donated", "weighed", "labelled", "scanned", "signed", "printed",
)  # fmt: skip
THINGS = (
    "bicycle", "laptop", "kayak", "piano", "tent", "camera", "sofa", "drone", "violin", "microscope", "espresso machine",
    "telescope", "sewing machine", "lawn mower", "aquarium", "bookshelf", "guitar", "projector", "3D printer", "treadmill",
    "canoe", "snowboard", "router", "heat pump", "solar panel", "dishwasher", "e-reader", "backpack", "ladder", "kiln",
    "chessboard", "typewriter", "water filter", "drill", "easel", "keyboard", "scooter", "air purifier", "lathe", "loom",
)  # fmt: skip
PLACES = (
    "Lisbon", "Oslo", "Nairobi", "Kyoto", "Quito", "Tbilisi", "Porto", "Hanoi", "Cork", "Tallinn", "Lagos", "Bergen",
    "Cusco", "Da Nang", "Ghent", "Hobart", "Izmir", "Jaipur", "Krakow", "Leon", "Malmo", "Nantes", "Oaxaca", "Perth",
    "Riga", "Split", "Turin", "Utrecht", "Vilnius", "Zagreb",
)  # fmt: skip
REASONS = (
    "before the trip", "for the workshop", "after the storm", "for the school fair", "to save money", "for a friend",
    "ahead of the audit", "for the winter", "after the move", "for the exhibition", "because it broke", "for the club",
)  # fmt: skip


TEMPLATES = (
    "{who} {did} the {what} in {where} on {day} {why}, paying ${amount} (ticket {ticket}).",
    "On {day} {who} {did} a {what} {why}; it cost {amount} euros.",
    "Remember that {who} keeps the {what} in {where} since {day}.",
    "{who} said the {what} from {where} was {did} {why}.",
    "Note: {ticket} is the order for the {what} {who} {did} in {where}.",
    "{who} and {other} {did} the {what} together in {where} {why}.",
    "The {what} was {did} again on {day}: {who} is annoyed, {amount} spent so far.",
    "{who} wants the {what} {did} before {day}, ideally in {where}.",
)


def _sentence(rng: random.Random) -> tuple[str, dict]:
    parts = {
        "who": rng.choice(PEOPLE),
        "other": rng.choice(PEOPLE),
        "did": rng.choice(ACTIONS),
        "what": rng.choice(THINGS),
        "where": rng.choice(PLACES),
        "why": rng.choice(REASONS),
        "day": f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
        "amount": rng.randint(5, 4000),
        "ticket": f"{rng.choice('ABCDEFGHJKLMNPRSTUVWXYZ')}{rng.choice('ABCDEFGHJKLMNPRSTUVWXYZ')}-{rng.randint(1000, 99999)}",
    }
    return rng.choice(TEMPLATES).format(**parts), parts


def memory_texts(count: int, seed: int) -> list[str]:
    """`count` distinct sentences, the same for the same seed."""
    rng, seen, out = random.Random(seed), set(), []
    while len(out) < count:
        text, _ = _sentence(rng)
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def queries(count: int, seed: int) -> list[str]:
    """`count` distinct questions over the same vocabulary (each names a person, a thing and more)."""
    rng, seen, out = random.Random(seed), set(), []
    forms = (
        "When was the {what} {did} by {who} in {where}?",
        "How much did {who} pay for the {what} {why}?",
        "What happened to the {what} in {where} on {day}?",
        "Which ticket was it when {who} {did} the {what}?",
        "Why did {who} go to {where} with the {what}?",
    )
    while len(out) < count:
        _, parts = _sentence(rng)
        question = rng.choice(forms).format(**parts)
        if question not in seen:
            seen.add(question)
            out.append(question)
    return out


def append_texts(client: httpx.Client, user: str, texts: list[str], first: int, per_session: int = 500) -> dict[str, int]:
    """Append as turns of sessions named by position (`first` is the position of texts[0])."""
    last: dict[str, int] = {}
    for start in tqdm(range(0, len(texts), 100), desc=f"append to {first + len(texts)}", unit="req", leave=False):
        position = first + start
        session = f"{user}-s{position // per_session}"
        chunk = texts[start : start + 100]
        messages = [{"role": "user" if (position + i) % 2 == 0 else "assistant", "content": t} for i, t in enumerate(chunk)]
        response = client.post(f"/v1/sessions/{session}/messages", json={"user_id": user, "messages": messages})
        response.raise_for_status()
        last[session] = response.json()["seqs"][-1]
    return last


async def insert_others(tenant: str, rows: int, users: int, dim: int, seed: int) -> None:
    """Other users' memories straight into both indexes, with synthetic vectors (idempotent ids)."""
    import numpy as np

    from serve_app.services.memory_writes import memory_row, save_memories
    from serve_app.settings import Settings
    from serve_app.stores.bundle import Stores

    settings = Settings()
    stores = await Stores.connect(settings)
    rng = np.random.default_rng(seed)
    texts = memory_texts(rows, seed + 1)
    now_ms = int(time.time() * 1000)
    try:
        for start in tqdm(range(0, rows, 2000), desc="other users' rows", unit="chunk"):
            chunk = texts[start : start + 2000]
            vectors = rng.standard_normal((len(chunk), dim)).astype("float32")
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            batch = [
                memory_row(
                    settings,
                    memory_id=f"scale-other-{start + i}",
                    tenant=tenant,
                    user=f"scale-other-{(start + i) % users}",
                    text=text,
                    created_at_ms=now_ms - (start + i) * 1000,
                    vector=vector.tolist(),
                    session=f"scale-other-s{(start + i) // 500}",
                    seq=(start + i) % 500 + 1,
                    role="user",
                    kind="turn",
                )
                for i, (text, vector) in enumerate(zip(chunk, vectors, strict=True))
            ]
            await save_memories(stores, batch)
        await stores.vectors.flush()
        async with stores.facts.pool.acquire() as conn:  # the planner must know the bulk-loaded sizes
            await conn.execute("ANALYZE memory_keywords; ANALYZE memory_postings")
    finally:
        await stores.close()


def figures(samples: list[float]) -> dict[str, float]:
    return {
        "p50_ms": percentile(samples, 50),
        "p95_ms": percentile(samples, 95),
        "p99_ms": percentile(samples, 99),
        "mean_ms": statistics.fmean(samples),
    }


async def concurrent_context(args, user: str, sessions: list[str], asked: list[str], served: Path | None) -> dict:
    """The window's figures and, with `served`, the CPU of its requests (the warm-up not counted)."""
    connector = aiohttp.TCPConnector(limit=args.concurrency + 8)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(args.url, connector=connector, timeout=timeout) as client:
        load = Load(client, user, sessions, asked)
        await run_window(load.context, args.concurrency, 3)
        before = cpu_mark(served)
        window = await run_window(load.context, args.concurrency, args.seconds)
        after = cpu_mark(served)
    if load.counter > len(asked):
        raise SystemExit(f"{load.counter} requests but {len(asked)} distinct queries: raise --queries")
    figures = window.figures()
    return {**figures, "cpu": cpu_per_request(before, after, figures["requests"], window.seconds)}


def wait_idle(served: Path | None, bound_ms_per_s: float, max_s: float, window_s: float = 5.0) -> tuple[float, float]:
    """Wait until the service's processes take less CPU than `bound_ms_per_s` over a window, or
    `max_s` passed; returns the wait and the last window's rate. Work a load leaves behind (the
    Milvus server compacts new segments for minutes) would otherwise be counted in the first
    windows' requests. Without `served`, no wait."""
    if served is None:
        return 0.0, float("nan")
    started = time.monotonic()
    while True:
        before = cpu_seconds(served)
        time.sleep(window_s)
        after = cpu_seconds(served)
        rate = 1000 * sum(service_cpu_used(before, after).values()) / window_s
        waited = time.monotonic() - started
        if rate < bound_ms_per_s or waited >= max_s:
            return waited, rate


def with_cpu(served: Path | None, requests: int, run: Callable[[], list[float]]) -> tuple[list[float], dict]:
    """What `run` returns, and the CPU its `requests` took in the service's processes and on the
    whole machine."""
    before, started = cpu_mark(served), time.perf_counter()
    samples = run()
    return samples, cpu_per_request(before, cpu_mark(served), requests, time.perf_counter() - started)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(int(s) for s in results)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, name in zip(axes, ("context", "search"), strict=True):
        for q, style in (("p50_ms", "o-"), ("p95_ms", "s--"), ("p99_ms", "^:")):
            ax.plot(sizes, [results[str(s)][name][q] for s in sizes], style, label=q.removesuffix("_ms"))
        ax.set_xscale("log")
        ax.set_xlabel("memories of the user")
        ax.set_ylabel("ms")
        ax.set_title(f"{name}, concurrency 1")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--data-dir", type=Path, default=Path(".memserve"), help="memserve up's data dir (for its PSS).")
    parser.add_argument("--tenant", default="local", help="Tenant of the other users' rows (keys off: local).")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--others", type=int, default=100_000, help="Rows of other users, with synthetic vectors.")
    parser.add_argument("--other-users", type=int, default=50)
    parser.add_argument("--requests", type=int, default=300, help="Sequential requests per endpoint and size.")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--queries", type=int, default=40_000, help="Distinct queries for the whole run.")
    parser.add_argument("--settle-s", type=float, default=10, help="Pause after loading each size.")
    parser.add_argument(
        "--idle-ms-per-s", type=float, default=300, help="After the pause, wait until the service takes less CPU than this."
    )
    parser.add_argument("--idle-max-s", type=float, default=600, help="The longest wait for that.")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", dest="json_out", type=Path, default=Path("bench/out/scale.json"))
    parser.add_argument("--png", type=Path, default=Path("bench/out/scale.png"))
    args = parser.parse_args()

    if args.others:
        asyncio.run(insert_others(args.tenant, args.others, args.other_users, 384, args.seed))
    user = "scale-" + uuid.uuid4().hex[:6]
    # The service's processes (the backends too) and this client: where each request's CPU went.
    served = args.data_dir if args.data_dir.exists() else None
    texts = memory_texts(max(args.sizes), args.seed + 2)
    asked = iter(queries(args.queries, args.seed + 3))
    results: dict[str, dict] = {}
    with httpx.Client(base_url=args.url, timeout=120) as client:
        session = f"{user}-now"
        turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(memory_texts(20, 99))]
        last = client.post(f"/v1/sessions/{session}/messages", json={"user_id": user, "messages": turns}).json()["seqs"][-1]
        wait_memorized(client, {session: last})
        sessions = [session] * args.concurrency  # concurrent contexts read the same session
        have = len(turns)  # the session's own turns are memories of the user too
        for size in tqdm(sorted(args.sizes), desc="sizes", unit="size"):
            if size > have:
                started = time.perf_counter()
                wait_memorized(client, append_texts(client, user, texts[have:size], have))
                loaded_s = time.perf_counter() - started
                have = size
            else:
                loaded_s = 0.0
            # New rows settle (the memorizer flushes Milvus every 2 s; autovacuum analyzes the
            # postings; the Milvus server compacts new segments for minutes), then a warm-up: what
            # is timed is the steady state at this size.
            time.sleep(args.settle_s)
            idle_s, idle_rate = wait_idle(served, args.idle_ms_per_s, args.idle_max_s)
            warm = [next(asked) for _ in range(30)]
            timed(
                client,
                len(warm),
                f"warm-up @{size}",
                lambda i, q=warm: client.post("/v1/context", json={"user_id": user, "session_id": session, "query": q[i]}),
            )
            context_queries = [next(asked) for _ in range(args.requests)]
            search_queries = [next(asked) for _ in range(args.requests)]
            context, context_cpu = with_cpu(
                served,
                args.requests,
                partial(
                    timed,
                    client,
                    args.requests,
                    f"context @{size}",
                    lambda i, q=context_queries: client.post(
                        "/v1/context", json={"user_id": user, "session_id": session, "query": q[i], "max_tokens": 4096}
                    ),
                ),
            )
            search, search_cpu = with_cpu(
                served,
                args.requests,
                partial(
                    timed,
                    client,
                    args.requests,
                    f"search @{size}",
                    lambda i, q=search_queries: client.post(
                        f"/v1/users/{user}/memories/search", json={"query": q[i], "top_k": 10}
                    ),
                ),
            )
            loaded = [next(asked) for _ in range(args.queries // (2 * len(args.sizes)))]
            concurrent = asyncio.run(concurrent_context(args, user, sessions, loaded, served))
            cpu = {"context": context_cpu, "search": search_cpu, f"context@{args.concurrency}": concurrent.pop("cpu")}
            results[str(size)] = {
                "memories": have,
                "load_s": round(loaded_s, 1),
                "idle_wait_s": round(idle_s, 1),
                "idle_ms_per_s": round(idle_rate, 1),
                "context": figures(context),
                "search": figures(search),
                "context_concurrent": concurrent,
                "cpu": cpu if served else {},
            }
    pss, ended = measure(args.data_dir) if args.data_dir.exists() else ({}, 0)
    report(results, pss, ended, args)
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps({"results": results, "pss_mib": pss, "args": vars(args)}, indent=2, default=str))
    plot(results, args.png)
    print(f"\nwrote {args.json_out} and {args.png}")


def report_cpu(results: dict, top: int = 4) -> None:
    """CPU ms per request, all processes together and the largest ones, and the throughput that sum
    allows on this machine's cores: no concurrency gets past it."""
    ordered = sorted(results.items(), key=lambda kv: int(kv[0]))
    rows = [(size, window, cpu) for size, row in ordered for window, cpu in row["cpu"].items()]
    if not rows:
        return
    cores = psutil.cpu_count() or 1
    print(f"\nCPU ms per request in the service's processes (the client not counted); {cores} cores carry at most")
    print(f"{cores} x 1000 / total requests a second. The machine's whole CPU over the same window, and what")
    print("of it neither the service's processes nor the client used (other processes, the kernel), checks the sum")
    print(f"{'memories':>9} {'window':<12} {'total':>7} {'req/s at most':>14} {'machine':>8} {'outside':>8}   largest")
    for size, window, cpu in rows:
        service = {group: ms for group, ms in cpu["ms_per_request"].items() if group != CLIENT}
        total = sum(service.values())
        largest = " | ".join(f"{group} {ms:.1f}" for group, ms in list(service.items())[:top])
        at_most = cores * 1000 / total if total else 0
        machine, outside = cpu["machine_ms_per_request"], cpu["outside_ms_per_request"]
        print(f"{size:>9} {window:<12} {total:>7.1f} {at_most:>14.0f} {machine:>8.1f} {outside:>8.1f}   {largest}")


def report(results: dict, pss: dict[str, float], ended: int, args) -> None:
    print(f"\none user among {args.others} rows of {args.other_users} other users (synthetic vectors); shipped defaults")
    head = f"{'memories':>9} {'ctx p50':>8} {'ctx p95':>8} {'ctx p99':>8} {'srch p50':>9} {'srch p95':>9} {'srch p99':>9}"
    print(head + f" {f'ctx@{args.concurrency} rps':>12} {f'ctx@{args.concurrency} p50':>12} {'load s':>8} {'idle wait s':>12}")
    for _, row in sorted(results.items(), key=lambda kv: int(kv[0])):
        c, s, cc = row["context"], row["search"], row["context_concurrent"]
        print(
            f"{row['memories']:>9} {c['p50_ms']:>8.1f} {c['p95_ms']:>8.1f} {c['p99_ms']:>8.1f} {s['p50_ms']:>9.1f} "
            f"{s['p95_ms']:>9.1f} {s['p99_ms']:>9.1f} {cc['throughput_rps']:>12.1f} {cc['p50_ms']:>12.1f} {row['load_s']:>8.1f}"
            f" {row.get('idle_wait_s', 0.0):>12.1f}"
        )
    report_cpu(results)
    if pss:
        print(f"PSS after the run: {sum(pss.values()):.0f} MiB ({', '.join(f'{k} {v:.0f}' for k, v in sorted(pss.items()))})"
              + (f"; {ended} processes ended while read" if ended else ""))  # fmt: skip


if __name__ == "__main__":
    main()
