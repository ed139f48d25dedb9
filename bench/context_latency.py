"""Latency of the hot endpoints of a running service over HTTP (one client, sequential).

    python -m bench.context_latency --url http://127.0.0.1:8000 --requests 300

Prepares one user with a 50-turn session and `--memories` long-term memories, then measures
POST /v1/context (recall + facts + history + budget), the append path and a GET /healthz floor.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid

import httpx
from tqdm import tqdm

from bench.common import percentile


def timed(client: httpx.Client, method: str, path: str, n: int, label: str, body=None, body_fn=None) -> list[float]:
    samples = []
    for i in tqdm(range(n), desc=label, unit="req", leave=False):
        payload = body_fn(i) if body_fn else body
        started = time.perf_counter()
        response = client.request(method, path, json=payload)
        samples.append((time.perf_counter() - started) * 1000)
        response.raise_for_status()
    return samples


def wait_memorized(client: httpx.Client, session: str, upto: int, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if client.get(f"/v1/sessions/{session}").json()["memorized_upto_seq"] >= upto:
            return
        time.sleep(0.5)
    raise TimeoutError("memorizer did not catch up")


CURRENT_TURNS = 50


def prepare_user(client: httpx.Client, user: str, memories: int) -> str:
    """A user with `memories` past turns (numbers, ids and dates in each), a 50-turn current session
    and one fact, all memorized; returns the current session's id."""
    history = f"{user}-past"
    past = [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": f"Past note {i}: project P-{i % 37} meeting on 2024-0{i % 9 + 1}-1{i % 10} about budget ${i * 13}.",
        }
        for i in range(memories)
    ]
    for start in range(0, memories, 100):
        body = {"user_id": user, "messages": past[start : start + 100]}
        client.post(f"/v1/sessions/{history}/messages", json=body).raise_for_status()
    session = f"{user}-now"
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"Turn {i} of the current task, step {i} done."}
        for i in range(CURRENT_TURNS)
    ]
    client.post(f"/v1/sessions/{session}/messages", json={"user_id": user, "messages": turns}).raise_for_status()
    client.put(f"/v1/users/{user}/facts/role", json={"value": "engineer", "category": "fact"}).raise_for_status()
    wait_memorized(client, history, memories)
    wait_memorized(client, session, CURRENT_TURNS)
    return session


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--memories", type=int, default=500, help="Long-term memories of the user (as past turns).")
    parser.add_argument("--json", dest="json_out", help="Write the figures to this file.")
    args = parser.parse_args()

    user = "bench-" + uuid.uuid4().hex[:8]
    with httpx.Client(base_url=args.url, timeout=120) as client:
        print("waiting for memorization of", args.memories + CURRENT_TURNS, "turns…")
        session = prepare_user(client, user, args.memories)

        n = args.requests
        context_body = {
            "user_id": user,
            "session_id": session,
            "query": "when is the budget meeting for P-7?",
            "max_tokens": 4096,
        }
        timed(client, "POST", "/v1/context", 20, "warm-up", body=context_body)
        results = {
            "healthz (floor)": timed(client, "GET", "/healthz", n, "healthz"),
            "POST /v1/context": timed(client, "POST", "/v1/context", n, "context", body=context_body),
            "append 1 message": timed(
                client,
                "POST",
                f"/v1/sessions/{user}-append/messages",
                n,
                "append",
                body_fn=lambda i: {"user_id": user, "messages": [{"role": "user", "content": f"message {i}"}]},
            ),  # fmt: skip
            "memory search": timed(
                client, "POST", f"/v1/users/{user}/memories/search", n, "search", body={"query": "budget meeting", "top_k": 10}
            ),
        }
    print(f"\n{'endpoint':<22}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'mean ms':>9}")
    figures = {}
    for name, samples in results.items():
        row = {
            "p50_ms": percentile(samples, 50),
            "p95_ms": percentile(samples, 95),
            "p99_ms": percentile(samples, 99),
            "mean_ms": statistics.fmean(samples),
        }
        figures[name] = row
        print(f"{name:<22}{row['p50_ms']:>9.1f}{row['p95_ms']:>9.1f}{row['p99_ms']:>9.1f}{row['mean_ms']:>9.1f}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
