"""Long-term recall on LoCoMo conversations, through the public HTTP API of a running service.

    python -m bench.locomo ../shared/data/locomo --url http://127.0.0.1:8000 --json bench/out/locomo.json

Each conversation is one user; speaker_a is the `user` role and speaker_b the `assistant` role;
each LoCoMo session is one session, appended in order with `created_at` from its date. Only the
dialogue is ingested (never the files' summaries, observations or events). Then every question of
categories 1-4 goes through memory search and through POST /v1/context in a fresh session.
Recall@k: the hits' source turns in rank order, the first k distinct dia_ids, the share of the
question's evidence among them, averaged.

Evidence in the prompt: what an agent actually sees. For each question, the share of its evidence
turns whose text (whitespace and case normalised) appears in the messages `/v1/context` returns,
at each of `--budgets` (2,048 and 8,192 tokens), with the shipped defaults; beside it the memory
tokens and total tokens of those prompts. The floors' side: the same for questions about things the
conversation never mentions (`bench.unrelated_queries`, written by hand, kept per file when they do
not touch it), where the floors should keep memory out, and for LoCoMo's category 5 (adversarial
questions about the conversation's own people and topics that it does not answer).

Search runs twice per question: with the shipped defaults (both relevance floors on, as
`/v1/context` and a plain search use them) and uncapped (`min_score: -1`, floors off). The recall
defaults were tuned by `bench.recall_tune` on the LoCoMo files of ../shared/data/locomo: figures on
those files are in-sample; on other conversations they are not.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from tqdm import tqdm

from bench.common import percentile, wait_memorized
from bench.locomo_data import CATEGORIES, parse_date, session_numbers, turn_content
from bench.unrelated_queries import unrelated_to

KS = (1, 5, 10, 20)
MODES = {"defaults": {}, "uncapped": {"min_score": -1}}


IN_SAMPLE = "in-sample on the files the defaults were tuned on (../shared/data/locomo); held out: bench.locomo_held_out"
UNANSWERABLE = 5  # LoCoMo's adversarial category: what the conversation does not say


def normalized(text: str) -> str:
    return " ".join(text.split()).lower()


def turn_texts(data: dict) -> dict[str, str]:
    """dia_id -> the turn's text as stored."""
    conversation = data.get("conversation", data)
    sessions = (conversation[f"session_{number}"] for number in session_numbers(conversation))
    return {turn["dia_id"]: turn_content(turn) for turns in sessions for turn in turns}


def build_context(client: httpx.Client, user: str, question: str, budget: int) -> dict:
    """/v1/context for a question asked in a fresh session of the user (nothing appended to it)."""
    body = {"user_id": user, "session_id": f"{user}-qa", "query": question, "max_tokens": budget}
    return client.post("/v1/context", json=body).json()


def evidence_in_prompt(messages: list[dict], evidence: set[str], texts: dict[str, str]) -> float:
    """The share of the evidence turns whose text the prompt holds (grouped or merged lines count)."""
    prompt = normalized("\n".join(str(m.get("content") or "") for m in messages))
    return sum(normalized(texts[e]) in prompt for e in evidence if e in texts) / len(evidence)


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


@dataclass
class Rows:
    """Per-question rows of one or more files: answerable questions, LoCoMo's category 5, unrelated ones."""

    questions: list[dict] = field(default_factory=list)
    unanswerable: list[dict] = field(default_factory=list)
    unrelated: list[dict] = field(default_factory=list)
    search_ms: dict[str, list[float]] = field(default_factory=lambda: {mode: [] for mode in MODES})
    context_ms: list[float] = field(default_factory=list)

    def extend(self, other: Rows) -> None:
        self.questions += other.questions
        self.unanswerable += other.unanswerable
        self.unrelated += other.unrelated
        for mode, ms in other.search_ms.items():
            self.search_ms[mode] += ms
        self.context_ms += other.context_ms


def collect(client: httpx.Client, paths: list[Path], budgets: list[int]) -> Rows:
    """Ingest each file as one user (memorized before any question), then ask every question."""
    run = uuid.uuid4().hex[:6]
    rows = Rows()
    for path in paths:
        data = json.loads(path.read_text())
        user = f"locomo-{path.stem}-{run}"
        where = ingest(client, data, user)
        last: dict[str, int] = {}
        for session, seq in where:
            last[session] = max(last.get(session, 0), seq)
        wait_memorized(client, last)
        texts = turn_texts(data)
        adversarial = [
            q.get("question") or q.get("adversarial_question") or "" for q in data["qa"] if q.get("category") == UNANSWERABLE
        ]
        for kept, asked, what in (
            (rows.unanswerable, adversarial, "unanswerable"),
            (rows.unrelated, unrelated_to(list(texts.values())), "unrelated"),
        ):
            for question in tqdm(asked, desc=f"{what} {path.name}", unit="q"):
                row = {"file": path.name}
                for budget in budgets:
                    usage = build_context(client, user, question, budget)["usage"]
                    row[f"memory tokens@{budget}"] = usage["sections"]["memory"]["tokens"]
                kept.append(row)
        questions = [q for q in data["qa"] if q.get("category") in CATEGORIES]
        for qa in tqdm(questions, desc=f"questions {path.name}", unit="q"):
            evidence = {e.strip() for item in qa["evidence"] for e in str(item).split(";") if e.strip()}
            if not evidence:
                continue
            row = {"file": path.name, "category": qa["category"]}
            for mode, options in MODES.items():
                started = time.perf_counter()
                hits = client.post(
                    f"/v1/users/{user}/memories/search", json={"query": qa["question"], "top_k": max(KS), **options}
                ).json()
                rows.search_ms[mode].append((time.perf_counter() - started) * 1000)
                ranked: list[str] = []
                for hit in hits:
                    dia = where.get((hit["session_id"], hit["seq"]))
                    if dia and dia not in ranked:
                        ranked.append(dia)
                for k in KS:
                    found = evidence & set(ranked[:k])
                    row[f"{mode} recall@{k}"] = len(found) / len(evidence)
                    row[f"{mode} full@{k}"] = float(found == evidence)
            for budget in budgets:
                started = time.perf_counter()
                built = build_context(client, user, qa["question"], budget)
                rows.context_ms.append((time.perf_counter() - started) * 1000)
                row[f"evidence@{budget}"] = evidence_in_prompt(built["messages"], evidence, texts)
                row[f"memory tokens@{budget}"] = built["usage"]["sections"]["memory"]["tokens"]
                row[f"total tokens@{budget}"] = built["usage"]["total_tokens"]
            rows.questions.append(row)
    return rows


def summarize(rows: Rows, budgets: list[int]) -> dict:
    per_question = rows.questions

    def mean(group, key):
        return statistics.fmean(r[key] for r in group) if group else 0.0

    def recall(group: list[dict]) -> dict[str, float]:
        figures = {f"{mode} recall@{k}": mean(group, f"{mode} recall@{k}") for mode in MODES for k in KS}
        for budget in budgets:
            figures[f"evidence@{budget}"] = mean(group, f"evidence@{budget}")
            figures[f"memory tokens@{budget}"] = mean(group, f"memory tokens@{budget}")
            figures[f"total tokens@{budget}"] = mean(group, f"total tokens@{budget}")
        return figures

    figures: dict = {"questions": len(per_question), "all": recall(per_question)}
    figures["full_coverage@10"] = {mode: mean(per_question, f"{mode} full@10") for mode in MODES}
    figures["search_p50_ms"] = {mode: percentile(ms, 50) for mode, ms in rows.search_ms.items()}
    figures["context_p50_ms"], figures["context_p95_ms"] = percentile(rows.context_ms, 50), percentile(rows.context_ms, 95)
    for name, group in (("unanswerable", rows.unanswerable), ("unrelated", rows.unrelated)):
        figures[name] = {
            "questions": len(group),
            **{f"memory tokens@{b}": mean(group, f"memory tokens@{b}") for b in budgets},
            **{
                f"share of answerable@{b}": mean(group, f"memory tokens@{b}") / max(1e-9, figures["all"][f"memory tokens@{b}"])
                for b in budgets
            },
        }
    figures["by_category"] = {CATEGORIES[c]: recall([r for r in per_question if r["category"] == c]) for c in CATEGORIES}
    figures["by_file"] = {
        f: recall([r for r in per_question if r["file"] == f]) for f in sorted({r["file"] for r in per_question})
    }
    return figures


def report(figures: dict, budgets: list[int], provenance: str) -> None:
    print("\nrecall@k of memory search: shipped defaults (floors on) | uncapped (min_score -1)")
    print(f"{'':<14}" + "".join(f"{'R@' + str(k):>8}" for k in KS) + "  |" + "".join(f"{'R@' + str(k):>8}" for k in KS))
    for name, row in {"all": figures["all"], **figures["by_category"], **figures["by_file"]}.items():
        cells = ["".join(f"{row[f'{mode} recall@{k}']:>8.3f}" for k in KS) for mode in MODES]
        print(f"{name:<14}" + "  |".join(cells))
    full = figures["full_coverage@10"]
    print(f"full coverage@10 {full['defaults']:.3f} | {full['uncapped']:.3f}; questions {figures['questions']}")
    print(f"search p50 {figures['search_p50_ms']['defaults']:.1f} | {figures['search_p50_ms']['uncapped']:.1f} ms; "
          f"context p50/p95 {figures['context_p50_ms']:.1f}/{figures['context_p95_ms']:.1f} ms")  # fmt: skip
    print("\nevidence in the prompt of /v1/context (fresh session, shipped defaults), its memory and total tokens")
    print(f"{'':<14}" + "".join(f"{'ev@' + str(b):>10}{'mem tok':>9}{'total':>7}" for b in budgets))
    for name, row in {"all": figures["all"], **figures["by_category"], **figures["by_file"]}.items():
        cells = (
            f"{row[f'evidence@{b}']:>10.3f}{row[f'memory tokens@{b}']:>9.0f}{row[f'total tokens@{b}']:>7.0f}" for b in budgets
        )
        print(f"{name:<14}" + "".join(cells))
    for name, what in (("unrelated", "never mentioned, bench.unrelated_queries"), ("unanswerable", "LoCoMo category 5")):
        none = figures[name]
        cells = "".join(f"{none[f'share of answerable@{b}']:>9.1%}{none[f'memory tokens@{b}']:>9.0f}{'':>7}" for b in budgets)
        print(f"{name:<15}{cells}   ({what}, {none['questions']} questions; share: of answerable memory tokens)")
    print(provenance)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="Directory of LoCoMo conversation files (*.json).")
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--api-key", default="", help="Bearer key when the service requires one.")
    parser.add_argument("--budgets", default="2048,8192", help="max_tokens of the context calls, comma-separated.")
    parser.add_argument("--json", dest="json_out", default="bench/out/locomo.json")
    args = parser.parse_args()

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    budgets = [int(b) for b in args.budgets.split(",")]
    with httpx.Client(base_url=args.url, timeout=120, headers=headers) as client:
        rows = collect(client, sorted(args.data.glob("*.json")), budgets)
    figures = summarize(rows, budgets)
    report(figures, budgets, IN_SAMPLE)
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2))
    plot(figures, out.with_suffix(".png"))


def plot(figures: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, style in zip(MODES, ("-", ":"), strict=True):
        ax.plot(KS, [figures["all"][f"{mode} recall@{k}"] for k in KS], marker="o", linestyle=style, label=f"all, {mode}")
    for name, row in figures["by_category"].items():
        ax.plot(KS, [row[f"defaults recall@{k}"] for k in KS], marker=".", linestyle="--", label=f"{name}, defaults")
    ax.set_xlabel("k")
    ax.set_ylabel("recall@k")
    ax.set_ylim(0, 1)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
