"""CPU per context with tracing on and off: two services on this machine (`memserve up`), B with
`MEMSERVE_TRACING=true` exporting every span over OTLP (http/protobuf) to a sink in this process, A
without; the same user and data on both, the same questions, requests interleaved in blocks (which
arm goes first alternates) so that both see the same machine.

    python -m bench.tracing_cost --rounds 40 --block 10

B needs the OTLP exporter (`pip install '.[otel]'`). CPU is that of each service's processes (Ray
workers, Redis, PostgreSQL, Milvus: `bench.memory.service_processes`) over each block, divided by
its requests; the Ingress's alone too, where the request's spans are made and exported. Background
work (the memorizer's sweep, Milvus's own timers) runs in both services alike and counts in both.
Prints each arm's median CPU per context (all processes, the Ingress's, and each process group's)
and the median of the per-round ratios B/A with a 95% bootstrap interval, and the ratio of the
arms' total CPU over all rounds with its own; the issue's target is at most 1.05.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
from tqdm import tqdm

from bench.common import memserve_up
from bench.context_ab import median_interval, quiet_level, settle
from bench.context_latency import prepare_user
from bench.load import CLIENT, INGRESS, cpu_seconds, service_cpu_used

QUESTIONS = [
    "what was decided about the budget of project P-{k}?",
    "when is the next meeting on P-{k}?",
    "which amounts did we discuss for P-{k} in 2024?",
    "remind me of the notes about P-{k}",
]


class OtlpSink:
    """An OTLP/HTTP trace receiver that accepts and counts: the collector B exports to."""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                sink.requests += 1
                sink.bytes += len(body)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def service_ms(before: dict[str, float], after: dict[str, float], requests: int) -> tuple[float, float]:
    """(all the service's processes, the Ingress alone): CPU ms per request over a window."""
    used = service_cpu_used(before, after)
    return 1000 * sum(used.values()) / requests, 1000 * used.get(INGRESS, 0.0) / requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--block", type=int, default=10, help="context requests per arm and round")
    parser.add_argument("--memories", type=int, default=500, help="past turns of the user")
    parser.add_argument("--work-dir", type=Path, default=None, help="data dirs of both services (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument(
        "--arm",
        action="append",
        default=[],
        metavar="NAME:VAR=VALUE,...",
        help="another traced service, with these variables over `on`'s (e.g. quiet:OTEL_TRACES_EXPORTER=none)",
    )
    args = parser.parse_args()

    sink = OtlpSink()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="tracing-cost-"))
    work.mkdir(parents=True, exist_ok=True)
    arms = {
        "off": {"MEMSERVE_TRACING": "false"},
        "on": {
            "MEMSERVE_TRACING": "true",
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url,
            "OTEL_TRACES_SAMPLER": "parentbased_always_on",
        },
    }
    for spec in args.arm:
        name, _, variables = spec.partition(":")
        arms[name] = arms["on"] | dict(pair.split("=", 1) for pair in variables.split(",") if pair)
    with ExitStack() as stack:
        urls = {arm: stack.enter_context(memserve_up(work / arm, env)) for arm, env in arms.items()}
        clients = {arm: stack.enter_context(httpx.Client(base_url=url, timeout=60)) for arm, url in urls.items()}
        user = "trace-" + uuid.uuid4().hex[:6]
        sessions = {arm: prepare_user(client, user, args.memories) for arm, client in clients.items()}
        idle = quiet_level(longest_s=90)
        for arm, client in clients.items():  # warm both: the first requests load what later ones reuse
            for k in range(20):
                context(client, user, sessions[arm], QUESTIONS[k % len(QUESTIONS)].format(k=k))
        settle(idle, longest_s=90)
        ms: dict[str, list[float]] = {arm: [] for arm in arms}
        ingress_ms: dict[str, list[float]] = {arm: [] for arm in arms}
        group_ms: dict[str, dict[str, list[float]]] = {arm: {} for arm in arms}
        exported_before = sink.requests
        for r in tqdm(range(args.rounds), desc="rounds", unit="round"):
            questions = [QUESTIONS[(r + i) % len(QUESTIONS)].format(k=(r * args.block + i) % 37) for i in range(args.block)]
            order = list(arms)
            for arm in order[r % len(order) :] + order[: r % len(order)]:  # each arm goes first in turn
                before = cpu_seconds(work / arm)
                for question in questions:
                    context(clients[arm], user, sessions[arm], question)
                after = cpu_seconds(work / arm)
                total, ingress = service_ms(before, after, args.block)
                ms[arm].append(total)
                ingress_ms[arm].append(ingress)
                for group, seconds in after.items():
                    if group != CLIENT:
                        group_ms[arm].setdefault(group, []).append(1000 * (seconds - before.get(group, 0.0)) / args.block)
        time.sleep(6)  # the batch span processor's schedule (5 s): the last spans reach the sink
    result = {
        "rounds": args.rounds,
        "block": args.block,
        "memories": args.memories,
        "arms": {arm: arms[arm] for arm in arms},
        "cpu_ms_per_context": {arm: round(statistics.median(v), 3) for arm, v in ms.items()},
        "ingress_cpu_ms_per_context": {arm: round(statistics.median(v), 3) for arm, v in ingress_ms.items()},
        "cpu_ms_per_context_by_process": {
            arm: {group: round(statistics.median(v), 3) for group, v in sorted(groups.items())}
            for arm, groups in group_ms.items()
        },
        "ratio_to_off": {arm: paired_ratio(ms[arm], ms["off"]) for arm in arms if arm != "off"},
        "ingress_ratio_to_off": {arm: paired_ratio(ingress_ms[arm], ingress_ms["off"]) for arm in arms if arm != "off"},
        "otlp_exports": sink.requests - exported_before,
        "otlp_bytes": sink.bytes,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


def paired_ratio(arm: list[float], off: list[float]) -> dict:
    """The median of the per-round ratios, with a 95% bootstrap interval; and the ratio of the
    arms' total CPU over all rounds (what a day of such requests costs), its interval resampling
    whole rounds, so each keeps its pair."""
    ratios = [a / o for a, o in zip(arm, off, strict=True)]
    low, high = median_interval(ratios)
    rng = random.Random(0)
    pairs = list(zip(arm, off, strict=True))
    totals = []
    for _ in range(2000):
        sample = rng.choices(pairs, k=len(pairs))
        totals.append(sum(a for a, _ in sample) / sum(o for _, o in sample))
    totals.sort()
    return {
        "median": round(statistics.median(ratios), 4),
        "ci95": [round(low, 4), round(high, 4)],
        "of_totals": round(sum(arm) / sum(off), 4),
        "of_totals_ci95": [round(totals[50], 4), round(totals[1949], 4)],
    }


def context(client: httpx.Client, user: str, session: str, question: str) -> None:
    body = {"user_id": user, "session_id": session, "query": question, "max_tokens": 4096}
    client.post("/v1/context", json=body).raise_for_status()


if __name__ == "__main__":
    main()
