"""Paired A/B of `/v1/context` on two running services: the same user and data on both, the same
distinct questions, requests interleaved (the order alternates) so that both see the same machine.

    # two checkouts, each up on its own ports, e.g. main before a change on :8001 and after on :8002
    python -m bench.context_ab http://127.0.0.1:8001 http://127.0.0.1:8002 --requests 500

Each service gets a user with a 500-turn past session (`--memories`) (numbers, ids and dates in every turn), a
50-turn current session and one fact, memorized before timing. Arms: each service with the
defaults, with `top_k` 0 (no recall: the rest of the request) and B with `top_k` 8 (the memory
count before the elastic budget). Timing starts once the machine is as quiet as it was before the
preparation (the memorizer, Milvus's compaction and PostgreSQL's autovacuum of the new rows done).
Prints each arm's p50 and the median of its paired differences against A's defaults with a 95%
bootstrap interval over rounds: on a noisy machine the paired difference is the figure to read, and
an interval wider than the effect says that this run cannot resolve it.

`--chat` (both services with an LLM, e.g. `llm_mode: openai` at the tiny Qwen2 of
`bench.vllm_server`) adds `POST /v1/chat/completions` streamed, timed to the first token of the
answer, in the same rounds; B's is paired against A's.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import uuid

import httpx
import psutil
from tqdm import tqdm

from bench.context_latency import prepare_user

PAST_TURNS = 500


def machine_busy(seconds: float = 3.0) -> float:
    """Share of all cores busy over the next `seconds`."""
    return psutil.cpu_percent(interval=seconds) / 100


def quiet_level(longest_s: float = 300, steady: int = 3) -> float:
    """The machine's busy share once it stops falling (`steady` readings in a row none lower than
    the lowest by more than two points), or after `longest_s`: two services just started are
    still loading models and warming their stores, and timing against that reading would not wait."""
    deadline = time.monotonic() + longest_s
    lowest, calm = machine_busy(), 0
    while calm < steady and time.monotonic() < deadline:
        busy = machine_busy()
        calm = calm + 1 if busy >= lowest - 0.02 else 0
        lowest = min(lowest, busy)
    return lowest


def settle(idle: float, margin: float = 0.05, longest_s: float = 300) -> float:
    """Wait until the machine is no busier than it was idle (plus `margin`), or `longest_s`; returns
    the last reading."""
    deadline = time.monotonic() + longest_s
    while (busy := machine_busy()) > idle + margin and time.monotonic() < deadline:
        pass
    return busy


def median_interval(diffs: list[float], rounds: int = 2000) -> tuple[float, float]:
    """95% bootstrap interval of the median paired difference."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(diffs, k=len(diffs))) for _ in range(rounds))
    return medians[int(0.025 * rounds)], medians[int(0.975 * rounds) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", help="URL of service A (the baseline)")
    parser.add_argument("b", help="URL of service B")
    parser.add_argument("--requests", type=int, default=500, help="requests per arm")
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--chat", action="store_true", help="also time chat completions to the first token")
    parser.add_argument("--memories", type=int, default=PAST_TURNS, help="past turns of the user (10000: the scale target)")
    args = parser.parse_args()
    user = "ab-" + uuid.uuid4().hex[:8]
    idle = quiet_level()
    for url in (args.a, args.b):
        with httpx.Client(base_url=url, timeout=120) as client:
            prepare_user(client, user, args.memories)
    clients = {"A": httpx.Client(base_url=args.a, timeout=60), "B": httpx.Client(base_url=args.b, timeout=60)}
    arms = {
        "A defaults": ("A", {}),
        "B defaults": ("B", {}),
        "A top_k 0": ("A", {"top_k": 0}),
        "B top_k 0": ("B", {"top_k": 0}),
        "B top_k 8": ("B", {"top_k": 8}),
    }
    for side, extra in arms.values():  # warm both before timing
        for i in range(10):
            body = {"user_id": user, "session_id": f"{user}-now", "query": f"warm-up {i}", "max_tokens": args.max_tokens}
            clients[side].post("/v1/context", json={**body, **extra}).raise_for_status()
    busy = settle(idle)
    print(f"machine busy {idle:.0%} quiet before preparing, {busy:.0%} when timing starts")
    samples: dict[str, list[float]] = {name: [] for name in arms}
    chats: dict[str, list[float]] = {"A chat first token": [], "B chat first token": []}
    prompts: dict[str, list[int]] = {"A": [], "B": []}
    for i in tqdm(range(args.requests), desc="paired requests", unit="round"):
        order = list(arms.items()) if i % 2 == 0 else list(reversed(arms.items()))
        query = f"when is the budget meeting for P-{i % 37} number {i}?"  # distinct: no query repeats
        for name, (side, extra) in order:
            body = {"user_id": user, "session_id": f"{user}-now", "query": query, "max_tokens": args.max_tokens, **extra}
            started = time.perf_counter()
            clients[side].post("/v1/context", json=body).raise_for_status()
            samples[name].append((time.perf_counter() - started) * 1000)
        if args.chat:
            for side in ("A", "B") if i % 2 == 0 else ("B", "A"):
                ms, prompt_tokens = first_token_ms(clients[side], user, query, session=f"{user}-chat-{i // 20}")
                chats[f"{side} chat first token"].append(ms)
                prompts[side].append(prompt_tokens)
    base = samples["A defaults"]
    print(f"\n{'arm':<12}{'p50 ms':>9}{'paired diff vs A defaults':>28}{'95% interval':>18}")
    for name, times in samples.items():
        diffs = [t - b for b, t in zip(base, times, strict=True)]
        low, high = median_interval(diffs)
        interval = f"{low:+.2f} .. {high:+.2f}" if name != "A defaults" else ""
        print(f"{name:<12}{statistics.median(times):>9.2f}{statistics.median(diffs):>+28.2f}{interval:>18}")
    if args.chat:
        a_chat, b_chat = chats["A chat first token"], chats["B chat first token"]
        diffs = [b - a for a, b in zip(a_chat, b_chat, strict=True)]
        low, high = median_interval(diffs)
        a50, b50 = statistics.median(a_chat), statistics.median(b_chat)
        print(f"\nchat, streamed, to the first token: p50 A {a50:.2f} ms, B {b50:.2f} ms")
        print(f"paired B - A {statistics.median(diffs):+.2f} ms, 95% interval {low:+.2f} .. {high:+.2f}")
        tokens = [b - a for a, b in zip(prompts["A"], prompts["B"], strict=True)]
        print(
            f"prompt tokens the model was sent: mean A {statistics.mean(prompts['A']):.1f}, "
            f"B {statistics.mean(prompts['B']):.1f}; B - A per round: median {statistics.median(tokens):+.0f}, "
            f"min {min(tokens):+d}, max {max(tokens):+d}"
        )


def first_token_ms(client: httpx.Client, user: str, question: str, *, session: str) -> tuple[float, int]:
    """A streamed chat call's time to the first chunk that carries answer text (or the end), and
    the prompt tokens its memory report says the model was sent (a difference in time to the first
    token may be the model's, for a longer prompt, rather than the service's)."""
    body = {"model": "m", "messages": [{"role": "user", "content": question}], "user": user, "stream": True,
            "max_completion_tokens": 4, "metadata": {"session_id": session}}  # fmt: skip
    started = time.perf_counter()
    first, prompt_tokens = None, -1
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[len("data: ") :])
            if first is None:
                choices = chunk.get("choices") or [{}]
                if (choices[0].get("delta") or {}).get("content"):
                    first = (time.perf_counter() - started) * 1000
            if "memory" in chunk:
                prompt_tokens = chunk["memory"].get("prompt_tokens", -1)
    return (first if first is not None else (time.perf_counter() - started) * 1000), prompt_tokens


if __name__ == "__main__":
    main()
