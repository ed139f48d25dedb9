"""Memory search latency over HTTP for one user holding many memories among other users' rows.

    python -m bench.search_latency ../shared/data/locomo --url http://127.0.0.1:8000 --memories 10000

Real text: the LoCoMo dialogue turns (cycled to reach `--memories`) are appended as sessions, then
memorized by the service; the LoCoMo questions are the queries. Hybrid search as shipped (dense +
BM25, fused), one client, sequential, after a warm-up. Prints p50/p95/p99 and the /healthz floor.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from pathlib import Path

import httpx
from tqdm import tqdm

from bench.common import percentile, wait_memorized
from bench.locomo_data import questions_of, turns_of


def store_memories(client: httpx.Client, user: str, texts: list[str], per_session: int = 500) -> dict[str, int]:
    """Append `texts` as alternating user/assistant turns; returns each session's last seq."""
    last: dict[str, int] = {}
    for start in tqdm(range(0, len(texts), 100), desc=f"append {user}", unit="req", leave=False):
        session = f"{user}-s{start // per_session}"
        messages = [
            {"role": "user" if (start + i) % 2 == 0 else "assistant", "content": text}
            for i, text in enumerate(texts[start : start + 100])
        ]
        response = client.post(f"/v1/sessions/{session}/messages", json={"user_id": user, "messages": messages})
        response.raise_for_status()
        last[session] = response.json()["seqs"][-1]
    return last


def timed(client: httpx.Client, n: int, label: str, call) -> list[float]:
    samples = []
    for i in tqdm(range(n), desc=label, unit="req", leave=False):
        started = time.perf_counter()
        response = call(i)
        samples.append((time.perf_counter() - started) * 1000)
        response.raise_for_status()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="Directory of LoCoMo files: the text of memories and queries.")
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--api-key", default="")
    parser.add_argument("--memories", type=int, default=10_000, help="Memories of the measured user.")
    parser.add_argument("--other-users", type=int, default=3)
    parser.add_argument("--other-memories", type=int, default=2_000, help="Memories of each other user.")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--json", dest="json_out", default="bench/out/search_latency.json")
    args = parser.parse_args()

    turns, questions = [], []
    for path in sorted(args.data.glob("*.json")):
        data = json.loads(path.read_text())
        turns += [t.content for t in turns_of(data)]
        questions += [q.text for q in questions_of(data)]
    texts = [turns[i % len(turns)] for i in range(args.memories)]
    run = uuid.uuid4().hex[:6]
    user = f"search-{run}"
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    with httpx.Client(base_url=args.url, timeout=120, headers=headers) as client:
        last = store_memories(client, user, texts)
        for other in range(args.other_users):
            offset = (other + 1) * 997
            last |= store_memories(
                client, f"other{other}-{run}", [turns[(offset + i) % len(turns)] for i in range(args.other_memories)]
            )
        wait_memorized(client, last)
        stored = sum(
            len(client.get(f"/v1/users/{user}/memories", params={"limit": 1000, "offset": o}).json())
            for o in range(0, args.memories, 1000)
        )

        def search(i: int) -> httpx.Response:
            return client.post(f"/v1/users/{user}/memories/search", json={"query": questions[i % len(questions)], "top_k": 10})

        timed(client, 30, "warm-up", search)
        floor = timed(client, args.requests, "healthz", lambda i: client.get("/healthz"))
        samples = timed(client, args.requests, "search", search)
    figures = {
        "memories_of_user": stored,
        "other_users": args.other_users,
        "other_memories_each": args.other_memories,
        "requests": len(samples),
        "search_p50_ms": statistics.median(samples),
        "search_p95_ms": percentile(samples, 95),
        "search_p99_ms": percentile(samples, 99),
        "healthz_p50_ms": statistics.median(floor),
    }
    print(
        f"\nmemory search over HTTP, hybrid, one user with {stored} memories among "
        f"{args.other_users} x {args.other_memories} other users' rows, {len(samples)} requests"
    )
    print("  search  " + "  ".join(f"p{q} {figures[f'search_p{q}_ms']:.1f} ms" for q in (50, 95, 99)))
    print(f"  /healthz p50 {figures['healthz_p50_ms']:.1f} ms (HTTP floor incl. three backend pings)")
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
