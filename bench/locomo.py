"""Long-term recall on LoCoMo conversations, through the public HTTP API of a running service.

    python -m bench.locomo ../shared/data/locomo --url http://127.0.0.1:8000 --json bench/out/locomo.json

Each conversation is one user; speaker_a is the `user` role and speaker_b the `assistant` role;
each LoCoMo session is one session, appended in order with `created_at` from its date. Only the
dialogue is ingested (never the files' summaries, observations or events). Then every question of
categories 1-4 goes through memory search and through POST /v1/context (2,048 tokens).
Recall@k: the hits' source turns in rank order, the first k distinct dia_ids, the share of the
question's evidence among them, averaged.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
import uuid
from pathlib import Path

import httpx
from tqdm import tqdm

from bench.common import percentile, wait_memorized
from bench.locomo_data import CATEGORIES, parse_date, session_numbers, turn_content

KS = (1, 5, 10, 20)


def ingest(client: httpx.Client, data: dict, user: str) -> dict[tuple[str, int], str]:
    """Append every session; returns (session_id, seq) -> dia_id."""
    where: dict[tuple[str, int], str] = {}
    conversation = data.get("conversation", data)
    speaker_a = conversation["speaker_a"]
    for number in session_numbers(conversation):
        session = f"{user}-s{number}"
        when = parse_date(conversation[f"session_{number}_date_time"])
        turns = conversation[f"session_{number}"]
        messages = [
            {
                "role": "user" if turn["speaker"] == speaker_a else "assistant",
                "content": turn_content(turn),
                "id": re.sub(r"[^A-Za-z0-9._@-]", "-", turn["dia_id"]),
                "created_at": when.isoformat(),
            }
            for turn in turns
        ]
        for start in range(0, len(messages), 100):
            response = client.post(
                f"/v1/sessions/{session}/messages", json={"user_id": user, "messages": messages[start : start + 100]}
            )
            response.raise_for_status()
            for turn, seq in zip(turns[start : start + 100], response.json()["seqs"], strict=True):
                where[(session, seq)] = turn["dia_id"]
    return where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="Directory of LoCoMo conversation files (*.json).")
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--api-key", default="", help="Bearer key when the service requires one.")
    parser.add_argument("--context-tokens", type=int, default=2048)
    parser.add_argument("--json", dest="json_out", default="bench/out/locomo.json")
    args = parser.parse_args()

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    run = uuid.uuid4().hex[:6]
    per_question = []
    search_ms: list[float] = []
    context_ms: list[float] = []
    memory_tokens: list[int] = []
    with httpx.Client(base_url=args.url, timeout=120, headers=headers) as client:
        for path in sorted(args.data.glob("*.json")):
            data = json.loads(path.read_text())
            user = f"locomo-{path.stem}-{run}"
            where = ingest(client, data, user)
            last: dict[str, int] = {}
            for session, seq in where:
                last[session] = max(last.get(session, 0), seq)
            wait_memorized(client, last)
            questions = [q for q in data["qa"] if q.get("category") in CATEGORIES]
            for qa in tqdm(questions, desc=f"questions {path.name}", unit="q"):
                evidence = {e.strip() for item in qa["evidence"] for e in str(item).split(";") if e.strip()}
                if not evidence:
                    continue
                started = time.perf_counter()
                hits = client.post(
                    f"/v1/users/{user}/memories/search", json={"query": qa["question"], "top_k": max(KS), "min_score": -1}
                ).json()
                search_ms.append((time.perf_counter() - started) * 1000)
                ranked: list[str] = []
                for hit in hits:
                    dia = where.get((hit["session_id"], hit["seq"]))
                    if dia and dia not in ranked:
                        ranked.append(dia)
                started = time.perf_counter()
                context = client.post(
                    "/v1/context",
                    json={
                        "user_id": user,
                        "session_id": f"{user}-qa",
                        "query": qa["question"],
                        "max_tokens": args.context_tokens,
                    },
                ).json()
                context_ms.append((time.perf_counter() - started) * 1000)
                memory_tokens.append(context["usage"]["sections"]["memory"]["tokens"])
                row = {"file": path.name, "category": qa["category"]}
                for k in KS:
                    found = evidence & set(ranked[:k])
                    row[f"recall@{k}"] = len(found) / len(evidence)
                    row[f"full@{k}"] = float(found == evidence)
                per_question.append(row)

    def mean(rows, key):
        return statistics.fmean(r[key] for r in rows) if rows else 0.0

    figures = {f"recall@{k}": mean(per_question, f"recall@{k}") for k in KS}
    figures |= {f"full_coverage@{k}": mean(per_question, f"full@{k}") for k in KS}
    figures["questions"] = len(per_question)
    figures["search_p50_ms"], figures["search_p95_ms"] = percentile(search_ms, 50), percentile(search_ms, 95)
    figures["context_p50_ms"], figures["context_p95_ms"] = percentile(context_ms, 50), percentile(context_ms, 95)
    figures["memory_tokens_in_context_mean"] = statistics.fmean(memory_tokens) if memory_tokens else 0
    figures["by_category"] = {
        CATEGORIES[c]: {f"recall@{k}": mean([r for r in per_question if r["category"] == c], f"recall@{k}") for k in KS}
        for c in CATEGORIES
    }
    figures["by_file"] = {
        f: {f"recall@{k}": mean([r for r in per_question if r["file"] == f], f"recall@{k}") for k in KS}
        for f in sorted({r["file"] for r in per_question})
    }

    print(f"\n{'':<14}" + "".join(f"{'R@' + str(k):>8}" for k in KS))
    print(f"{'all':<14}" + "".join(f"{figures[f'recall@{k}']:>8.3f}" for k in KS))
    for name, row in {**figures["by_category"], **figures["by_file"]}.items():
        print(f"{name:<14}" + "".join(f"{row[f'recall@{k}']:>8.3f}" for k in KS))
    print(f"full coverage@10 {figures['full_coverage@10']:.3f}; questions {figures['questions']}")
    print(f"search p50/p95 {figures['search_p50_ms']:.1f}/{figures['search_p95_ms']:.1f} ms; "
          f"context p50/p95 {figures['context_p50_ms']:.1f}/{figures['context_p95_ms']:.1f} ms; "
          f"memory tokens in context {figures['memory_tokens_in_context_mean']:.0f}")  # fmt: skip
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2))
    plot(figures, out.with_suffix(".png"))


def plot(figures: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(KS, [figures[f"recall@{k}"] for k in KS], marker="o", label="all")
    for name, row in figures["by_category"].items():
        ax.plot(KS, [row[f"recall@{k}"] for k in KS], marker=".", linestyle="--", label=name)
    ax.set_xlabel("k")
    ax.set_ylabel("recall@k")
    ax.set_ylim(0, 1)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
