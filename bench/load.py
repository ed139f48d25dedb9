"""Bounded load against a running service on loopback: append, context build and the agent loop at
concurrency 1, 8 and 32, next to the floor (a no-op route on the same ingress deployment).

    python -m bench.load ../shared/data/locomo --url http://127.0.0.1:8000 \\
        --components bench/out/components.json --json bench/out/load.json

Prepares one user with `--memories` long-term memories (real LoCoMo turns), a 50-turn session per
worker among them; then, per scenario and concurrency, a warm-up and a timed window of closed-loop
workers (each sends its next request when the previous one answered). Append writes sessions of
another user, so context builds always read the prepared 50-turn sessions and recall from the
same `--memories`; after each window the run waits until the memorizer has caught up with every
turn it appended (and prints how long that took), so no window is timed against the previous
one's backlog. The client is aiohttp: httpx spent about 2 ms of CPU per request at concurrency 32,
a core of the two the service runs on.

Prints absolute figures, each scenario's ratio to the floor, and to the sum of its parts measured
alone by `bench.components` (run that first), then checks the targets of the load issue. With the
service's `--data-dir` it also prints, per window, the CPU each request cost in each process group
(Ingress, Embedder, Milvus Lite, ..., this client) and how busy the machine was: the process near a
full core is the bottleneck. Writes JSON and a PNG (latency percentiles and throughput per scenario).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import httpx
import psutil
from tqdm import tqdm

from bench.common import percentile, wait_memorized
from bench.locomo_data import questions_of, turns_of
from bench.memory import GROUPS, cpu_s, group_of, service_processes
from bench.search_latency import store_memories

CONCURRENCY = (1, 8, 32)
SCENARIOS = ("floor", "append", "context", "agent_loop")


@dataclass
class Window:
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0

    def figures(self) -> dict[str, float]:
        done = len(self.latencies_ms)
        return {
            "requests": done,
            "errors": self.errors,
            "p50_ms": percentile(self.latencies_ms, 50),
            "p95_ms": percentile(self.latencies_ms, 95),
            "p99_ms": percentile(self.latencies_ms, 99),
            "throughput_rps": done / self.seconds if self.seconds else 0.0,
            "seconds": self.seconds,
        }


class Load:
    def __init__(self, client: aiohttp.ClientSession, user: str, sessions: list[str], queries: list[str]):
        self.client = client
        self.user = user
        self.sessions = sessions
        self.queries = queries
        self.counter = 0
        self.appended: dict[str, int] = {}  # session -> last acknowledged seq, for the settle step

    def _next(self) -> int:
        self.counter += 1
        return self.counter

    @staticmethod
    async def _check(response: aiohttp.ClientResponse) -> dict:
        body = await response.read()
        if response.status >= 400:
            raise RuntimeError(f"{response.status}: {body[:200]!r}")
        return json.loads(body)

    async def floor(self, worker: int) -> None:
        async with self.client.get("/v1/ping") as response:
            await self._check(response)

    async def _append(self, session: str, role: str, user: str | None = None) -> None:
        n = self._next()
        body = {
            "user_id": user or self.user,
            "messages": [{"role": role, "content": f"load turn {n}: ticket T-{n} is open", "id": f"l{n}"}],
        }
        async with self.client.post(f"/v1/sessions/{session}/messages", json=body) as response:
            seq = (await self._check(response))["seqs"][-1]
        self.appended[session] = max(seq, self.appended.get(session, 0))

    async def append(self, worker: int) -> None:
        # Another user: its turns must not grow the 10k memories the context scenario recalls from.
        writer = f"{self.user}-writer"
        await self._append(f"{writer}-s{worker}", "user", writer)

    async def context(self, worker: int) -> None:
        body = {
            "user_id": self.user,
            "session_id": self.sessions[worker],
            "query": self.queries[self._next() % len(self.queries)],
            "max_tokens": 4096,
        }
        async with self.client.post("/v1/context", json=body) as response:
            await self._check(response)

    async def agent_loop(self, worker: int) -> None:
        await self._append(self.sessions[worker], "user")
        await self.context(worker)
        await self._append(self.sessions[worker], "assistant")


async def run_window(op, concurrency: int, seconds: float) -> Window:
    window = Window()
    deadline = time.perf_counter() + seconds

    async def worker(index: int) -> None:
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            try:
                await op(index)
                window.latencies_ms.append((time.perf_counter() - started) * 1000)
            except Exception:
                window.errors += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    window.seconds = time.perf_counter() - started
    return window


async def prepare_sessions(client: httpx.AsyncClient, user: str, count: int, turns: list[str]) -> list[str]:
    sessions = []
    for worker in tqdm(range(count), desc="50-turn sessions", unit="session", leave=False):
        session = f"{user}-load{worker}"
        messages = [
            {"role": "user" if i % 2 == 0 else "assistant", "content": turns[(worker * 50 + i) % len(turns)]} for i in range(50)
        ]
        (await client.post(f"/v1/sessions/{session}/messages", json={"user_id": user, "messages": messages})).raise_for_status()
        sessions.append(session)
    return sessions


CONTEXT_PARTS = (
    "query embedding",
    "vector recall",
    "keyword recall",
    "winner details",
    "second-stage ranking",
    "get history",
    "fact query",
    "context budget",
)


def component_sums(components: dict) -> dict[str, float]:
    """p50 sums of the parts each scenario is made of (parts that run concurrently still add up here)."""

    def p50(name_start: str) -> float:
        return next(v["p50_ms"] for k, v in components.items() if k.startswith(name_start))

    context = sum(p50(part) for part in CONTEXT_PARTS)
    return {"append": p50("store message"), "context": context, "agent_loop": context + 2 * p50("store message")}


CLIENT = "load client (this process)"
INGRESS = dict(GROUPS)["Ingress"]


def machine_busy_s() -> float:
    """CPU seconds every process of the machine and the kernel have used (user, nice, system,
    interrupts; guest time is inside user and nice already; steal is the hypervisor's): the check
    that no process of the service escapes the sum of its groups."""
    times = psutil.cpu_times()
    return sum(getattr(times, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq"))


def cpu_seconds(data_dir: Path | None) -> dict[str, float]:
    """CPU seconds (user + system) used so far by each group of the service's processes, and by
    this client: the difference over a window says where each request's CPU went. The processes are
    found afresh on every call: a connection pool that grows under load starts PostgreSQL backends
    that a list taken before the load would miss (their CPU then counts whole, as spent in the window)."""
    totals: dict[str, float] = defaultdict(float)
    for proc in service_processes(data_dir) if data_dir else []:
        try:
            group = group_of(proc)
        except psutil.Error:  # ended since it was listed: its CPU is no longer anyone's to read
            continue
        totals[group] += cpu_s(proc)
    totals[CLIENT] = cpu_s(psutil.Process())
    return dict(totals)


def service_cpu_used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds each group of the service's processes used between two `cpu_seconds` readings,
    this client left out."""
    return {group: after[group] - before.get(group, 0.0) for group in after if group != CLIENT}


CpuMark = tuple[dict[str, float], float]
"""`cpu_seconds` of the service's groups and `machine_busy_s`, read together at one end of a window."""


def cpu_mark(data_dir: Path | None) -> CpuMark:
    return cpu_seconds(data_dir), machine_busy_s()


def cpu_per_request(before: CpuMark, after: CpuMark, requests: int, seconds: float) -> dict:
    """Per request, between two marks: each group's CPU, and the machine's whole CPU with what of it
    no group counted (other processes, the kernel's work for no process, a process of the service
    that the search for them missed)."""
    (groups_before, machine_before), (groups_after, machine_after) = before, after
    used = {group: groups_after[group] - groups_before.get(group, 0.0) for group in groups_after}
    per = 1000 / max(1, requests)
    machine = machine_after - machine_before
    return {
        "machine_busy": sum(used.values()) / (seconds * (psutil.cpu_count() or 1)),
        "ms_per_request": {g: per * v for g, v in sorted(used.items(), key=lambda kv: -kv[1]) if v > 0},
        "machine_ms_per_request": per * machine,
        "outside_ms_per_request": per * (machine - sum(used.values())),
    }


async def main_async(args) -> tuple[dict, dict]:
    turns, queries = [], []
    for path in sorted(args.data.glob("*.json")):
        data = json.loads(path.read_text())
        turns += [t.content for t in turns_of(data)]
        queries += [q.text for q in questions_of(data)]
    user = "load-" + uuid.uuid4().hex[:6]
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    with httpx.Client(base_url=args.url, timeout=120, headers=headers) as sync:
        # The prepared sessions' turns are memories too: together they make `--memories`.
        count = max(0, args.memories - 50 * max(CONCURRENCY))
        last = store_memories(sync, user, [turns[i % len(turns)] for i in range(count)])
        wait_memorized(sync, last)
    results: dict[str, dict] = {}
    settled: dict[str, float] = {}
    async with httpx.AsyncClient(base_url=args.url, timeout=60, headers=headers) as client:
        sessions = await prepare_sessions(client, user, max(CONCURRENCY), turns)
    with httpx.Client(base_url=args.url, timeout=120, headers=headers) as sync:
        wait_memorized(sync, {s: 50 for s in sessions})  # or the floor is timed while they are embedded
    connector = aiohttp.TCPConnector(limit=max(CONCURRENCY) + 8)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(args.url, connector=connector, timeout=timeout, headers=headers) as client:
        load = Load(client, user, sessions, queries)
        steps = [(s, c) for s in args.scenarios for c in CONCURRENCY]
        for scenario, concurrency in tqdm(steps, desc="scenarios", unit="window"):
            op = getattr(load, scenario)
            await run_window(op, concurrency, args.warmup)
            before = cpu_mark(args.data_dir)
            window = await run_window(op, concurrency, args.seconds)
            figures = window.figures()
            if args.data_dir:
                figures["cpu"] = cpu_per_request(before, cpu_mark(args.data_dir), figures["requests"], window.seconds)
            results[f"{scenario}@{concurrency}"] = figures
            if load.appended:  # each window starts from a caught-up memorizer
                started = time.perf_counter()
                with httpx.Client(base_url=args.url, timeout=120, headers=headers) as sync:
                    wait_memorized(sync, load.appended)
                settled[f"{scenario}@{concurrency}"] = time.perf_counter() - started
                load.appended = {}
    return results, settled


def report(results: dict, components: dict | None) -> dict:
    header = ["p50 ms", "p95 ms", "p99 ms", "req/s", "errors", "p50/floor", "rps/floor", "p50/parts"]
    print(f"\n{'scenario':<16}{'c':>4}" + "".join(f"{h:>11}" for h in header))
    sums = component_sums(components) if components else {}
    for key, row in results.items():
        scenario, concurrency = key.split("@")
        floor = results.get(f"floor@{concurrency}", {"p50_ms": float("nan"), "throughput_rps": float("nan")})
        ratio_parts = row["p50_ms"] / sums[scenario] if scenario in sums else float("nan")
        print(
            f"{scenario:<16}{concurrency:>4}{row['p50_ms']:>11.1f}{row['p95_ms']:>11.1f}{row['p99_ms']:>11.1f}"
            f"{row['throughput_rps']:>11.1f}{row['errors']:>11}{row['p50_ms'] / floor['p50_ms']:>11.2f}"
            f"{row['throughput_rps'] / floor['throughput_rps']:>11.2f}{ratio_parts:>11.2f}"
        )
    checks: dict[str, dict] = {}
    if components and {f"{s}@{c}" for s in SCENARIOS[:3] for c in CONCURRENCY} <= results.keys():

        def part(name_start: str) -> dict:
            return next(v for k, v in components.items() if k.startswith(name_start))

        floor1, ctx1, ctx32 = results["floor@1"], results["context@1"], results["context@32"]
        bound = floor1["p50_ms"] + part("query embedding")["p50_ms"] + part("vector recall")["p50_ms"] + 5
        # Each part's throughput at concurrency 32, measured alone as the request calls it (bench.components).
        parts = {k: part(k)["qps_c32"] for k in CONTEXT_PARTS}
        bottleneck = min(parts, key=parts.get)
        checks = {
            "context@1 p50 <= floor + embedding + vector recall + 5 ms": {"value": ctx1["p50_ms"], "bound": bound},
            "context@1 p99 <= 2.5 x p50": {"value": ctx1["p99_ms"], "bound": 2.5 * ctx1["p50_ms"]},
            f"context@32 throughput >= 70% of its bottleneck ({bottleneck})": {
                "value": ctx32["throughput_rps"],
                "bound": 0.7 * parts[bottleneck],
                "at_least": True,
            },
            "append@1 p50 <= 1.3 x floor p50": {"value": results["append@1"]["p50_ms"], "bound": 1.3 * floor1["p50_ms"]},
            "append@32 throughput >= 70% of the floor's": {
                "value": results["append@32"]["throughput_rps"],
                "bound": 0.7 * results["floor@32"]["throughput_rps"],
                "at_least": True,
            },
        }
        # What the append bounds leave room for, from figures measured here (not assumed).
        write = part("store message")["p50_ms"]
        checks["append@1 p50 <= 1.3 x floor p50"]["note"] = (
            f"the floor plus one durable session-log write measured alone is {floor1['p50_ms'] + write:.2f} ms"
        )
        ingress = {k: results[k].get("cpu", {}).get("ms_per_request", {}).get(INGRESS) for k in ("append@32", "floor@32")}
        if None not in ingress.values():
            checks["append@32 throughput >= 70% of the floor's"]["note"] = (
                f"Ingress CPU per request: {ingress['append@32']:.2f} ms for an append, {ingress['floor@32']:.2f} ms for a no-op"
            )
        print("\ntargets")
        for name, check in checks.items():
            met = check["value"] >= check["bound"] if check.get("at_least") else check["value"] <= check["bound"]
            check["met"] = met
            note = f" ({check['note']})" if "note" in check else ""
            print(f"  {'met ' if met else 'MISS'} {name}: {check['value']:.1f} vs {check['bound']:.1f}{note}")
    return checks


def report_cpu(results: dict, top: int = 5) -> None:
    """Where each window's CPU went, per request: the bottleneck process is the one near a core."""
    rows = {k: v["cpu"] for k, v in results.items() if "cpu" in v}
    if not rows:
        return
    print("\nCPU ms per request by process (machine busy = share of all cores over the window)")
    for key, cpu in rows.items():
        parts = " | ".join(f"{g} {ms:.2f}" for g, ms in list(cpu["ms_per_request"].items())[:top])
        parts += f"  (machine {cpu['machine_ms_per_request']:.2f}, outside every group {cpu['outside_ms_per_request']:.2f})"
        print(f"  {key:<15} busy {100 * cpu['machine_busy']:3.0f}%  {parts}")


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(results)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    x = range(len(keys))
    for offset, q in ((-0.25, "p50_ms"), (0.0, "p95_ms"), (0.25, "p99_ms")):
        left.bar([i + offset for i in x], [results[k][q] for k in keys], width=0.25, label=q.replace("_ms", ""))
    left.set_xticks(list(x), keys, rotation=60, ha="right")
    left.set_ylabel("latency (ms)")
    left.set_yscale("log")
    left.legend()
    right.bar(list(x), [results[k]["throughput_rps"] for k in keys])
    right.set_xticks(list(x), keys, rotation=60, ha="right")
    right.set_ylabel("throughput (req/s)")
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="Directory of LoCoMo files (text of memories and queries).")
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--api-key", default="")
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=10.0, help="Timed window per scenario and concurrency.")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument(
        "--scenarios",
        type=lambda v: v.split(","),
        default=list(SCENARIOS),
        help=f"Comma-separated subset of {','.join(SCENARIOS)}.",
    )
    parser.add_argument("--components", type=Path, default=Path("bench/out/components.json"))
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(".memserve"),
        help="The service's --data-dir: its processes' CPU per request is reported per window ('' to skip).",
    )
    parser.add_argument("--json", dest="json_out", default="bench/out/load.json")
    args = parser.parse_args()
    results, settled = asyncio.run(main_async(args))
    for window, seconds in settled.items():
        print(f"{window}: the memorizer caught up with its turns {seconds:.1f} s after the window")
    components = json.loads(args.components.read_text()) if args.components.exists() else None
    if components is None:
        print(f"(no {args.components}: run bench.components first for the ratios to the parts)")
    report_cpu(results)
    checks = report(results, components)
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"scenarios": results, "targets": checks, "memorizer_catch_up_s": settled}, indent=2))
    plot(results, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
