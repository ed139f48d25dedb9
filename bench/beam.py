"""Long-conversation recall on BEAM conversations, through the public HTTP API of a running service.

    python -m bench.beam --url http://127.0.0.1:8000 --out bench/out/beam.json
    python -m bench.beam --dense-baseline --out bench/out/beam-dense.json

Measured as `bench.locomo` measures LoCoMo. Each conversation is one user; each batch one session,
its messages appended in order with `created_at` from the batch's date and the message's number as
client id (a message the service refuses with a 422 is counted, never retried); then, once
everything is memorized, every question that names its source messages
(abstention questions name none) goes through memory search and through POST /v1/context in a fresh
session. Ingest throughput is messages and characters from the first append to the last message
memorized. Five questions no conversation answers measure the memory an unrelated question's
prompt still gets, as a share of an answerable question's.

- **Recall@k**: the hits mapped back to their source messages (session and seq), the first k distinct
  messages, the share of the question's source messages among them, averaged. Search asks for
  `--top-k` hits so that a message recalled as several pieces still counts once; with the shipped
  defaults (floors on) and uncapped (`min_score: -1`).
- **Evidence in the prompt** at each budget, two ways (`bench.beam_evidence`): the share of the
  source messages of which any passage is quoted, and of which the passage answering the question is.

`--dense-baseline`: no service; the bundled embedding model in process, one vector per whole message
(the model reads its first 256 word pieces, as any dense search over whole messages does), cosine
over all of the conversation's messages, recall@k the same way.

The data (`../shared/data/beam`, research use only: cite "Beyond a Million Tokens: Benchmarking and
Enhancing Long-Term Memory in LLMs", ICLR 2026) stays outside the repository. The second stage's
long model was fitted on candidates of some of its conversations (`--candidates`, bench.rerank_fit):
recall on those is in-sample; rerank_fit's leave-one-conversation-out figures are the held-out ones.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import httpx
from tqdm import tqdm

from bench.beam_data import (
    ABILITIES,
    Conversation,
    Message,
    Question,
    conversation_folders,
    default_data_dir,
    load_conversation,
    truncated,
)
from bench.beam_evidence import Corpus, PromptText, answer_passage, passages, without_summaries
from bench.common import percentile, wait_memorized

KS = (1, 5, 10, 20)
UNRELATED = (
    "What is the boiling point of water at the top of Mount Everest?",
    "Translate 'good morning' into Portuguese.",
    "Who painted the ceiling of the Sistine Chapel?",
    "Write a haiku about autumn leaves.",
    "How many bones are in the adult human body?",
)
"""Questions no conversation answers: what memory their prompts get is memory spent on nothing."""
MODES = {"defaults": {}, "uncapped": {"min_score": -1}}
KEPT_REASONS = ("similarity", "keywords", "no_floor", "beyond_limit")
"""An explained candidate with one of these passed the floors: the second stage ranks it."""
APPEND_BATCH = 100  # the API's most messages per request
LENGTHS = ((0, 1000), (1000, 3000), (3000, 10**9))  # source messages by characters, for the breakdown


@dataclass
class Ingested:
    """What one conversation's ingestion left: where each message is, what was refused, how long it took."""

    where: dict[tuple[str, int], int] = field(default_factory=dict)
    refused: list[int] = field(default_factory=list)
    last_seq: dict[str, int] = field(default_factory=dict)
    append_s: float = 0.0
    searchable_s: float = 0.0
    messages: int = 0
    chars: int = 0


def wire(message: Message) -> dict:
    return {"role": message.role, "content": message.content, "id": f"m{message.id}", "created_at": message.when.isoformat()}


def append(client: httpx.Client, user: str, session: str, messages: list[Message], ingested: Ingested) -> None:
    """Append one request's messages; a 422 (a message over the limit) is retried one message at a
    time, so that only the message the service refuses is left out."""
    response = client.post(f"/v1/sessions/{session}/messages", json={"user_id": user, "messages": [wire(m) for m in messages]})
    if response.status_code == 422 and len(messages) > 1:
        for message in messages:
            append(client, user, session, [message], ingested)
        return
    if response.status_code == 422:
        ingested.refused.append(messages[0].id)
        return
    response.raise_for_status()
    for message, seq in zip(messages, response.json()["seqs"], strict=True):
        ingested.where[(session, seq)] = message.id
        ingested.last_seq[session] = max(ingested.last_seq.get(session, 0), seq)
        ingested.messages += 1
        ingested.chars += len(message.content)


def ingest(client: httpx.Client, conversation: Conversation, user: str) -> Ingested:
    """Every batch as a session of `user`, appended in order, then waited on until memorized."""
    ingested = Ingested()
    started = time.perf_counter()
    batches: dict[int, list[Message]] = {}
    for message in conversation.messages:
        batches.setdefault(message.batch, []).append(message)
    for batch, messages in tqdm(batches.items(), desc=f"append {conversation.name}", unit="session", leave=False):
        session = f"{user}-b{batch}"
        for start in range(0, len(messages), APPEND_BATCH):
            append(client, user, session, messages[start : start + APPEND_BATCH], ingested)
    ingested.append_s = time.perf_counter() - started
    wait_memorized(client, ingested.last_seq, timeout_s=6 * 3600)
    ingested.searchable_s = time.perf_counter() - started
    return ingested


def already_ingested(conversation: Conversation, user: str) -> Ingested:
    """Where each message of a conversation a run ingested before is (`--reuse`): its batches'
    sessions take their messages at seqs 1.. in order, as `ingest` appended them."""
    ingested = Ingested()
    seqs: dict[int, int] = {}
    for message in conversation.messages:
        seqs[message.batch] = seqs.get(message.batch, 0) + 1
        ingested.where[(f"{user}-b{message.batch}", seqs[message.batch])] = message.id
        ingested.messages += 1
        ingested.chars += len(message.content)
    return ingested


def distinct(ids: Iterable[int | None]) -> list[int]:
    out: list[int] = []
    for i in ids:
        if i is not None and i not in out:
            out.append(i)
    return out


def recall_row(ranked: list[int], sources: tuple[int, ...], prefix: str) -> dict[str, float]:
    return {f"{prefix}recall@{k}": len(set(sources) & set(ranked[:k])) / len(sources) for k in KS}


def source_details(question: Question, by_id: dict[int, Message]) -> list[dict]:
    """Per source message: its size and role, and where in it the answer passage sits."""
    out = []
    for source in question.sources:
        text = by_id[source].content
        index, _ = answer_passage(text, question.answer)
        out.append(
            {
                "id": source,
                "role": by_id[source].role,
                "chars": len(text),
                "passages": len(passages(text)) or 1,
                "answer_passage": index,
            }
        )
    return out


@dataclass
class Stored:
    """One conversation as a user of the service holds it: what the questions are checked against."""

    user: str
    ingested: Ingested
    by_id: dict[int, Message]
    corpus: Corpus

    @classmethod
    def of(cls, user: str, ingested: Ingested, conversation: Conversation) -> Stored:
        by_id = {m.id: m for m in conversation.messages}
        return cls(user, ingested, by_id, Corpus([m.content for m in conversation.messages]))


def search(client: httpx.Client, stored: Stored, question: Question, top_k: int) -> dict:
    """Memory search in both modes: recall@k over distinct messages, latency, the ranked ids."""
    row: dict = {}
    for mode, options in MODES.items():
        started = time.perf_counter()
        body = {"query": question.text, "top_k": top_k, **options}
        response = client.post(f"/v1/users/{stored.user}/memories/search", json=body)
        row[f"{mode} search_ms"] = (time.perf_counter() - started) * 1000
        response.raise_for_status()
        ranked = distinct(stored.ingested.where.get((hit["session_id"], hit["seq"])) for hit in response.json())
        row[f"{mode} ranked"] = ranked[: max(KS)]
        row.update(recall_row(ranked, question.sources, f"{mode} "))
    return row


def prompt_evidence(prompt: PromptText, question: Question, stored: Stored) -> tuple[list[bool], list[bool]]:
    """For each source message: any passage of it quoted (its answer passage is one); its answer
    passage quoted."""
    texts = [stored.by_id[s].content for s in question.sources]
    answering = [prompt.quotes_passage(answer_passage(text, question.answer)[1]) for text in texts]
    anywhere = [found or prompt.quotes_any(text, stored.corpus) for text, found in zip(texts, answering, strict=True)]
    return anywhere, answering


def context(client: httpx.Client, stored: Stored, question: Question, session: str, budget: int, sources: list[dict]) -> dict:
    """/v1/context in a session of its own; the evidence it quotes, marked on `sources` too."""
    body = {"user_id": stored.user, "session_id": session, "query": question.text, "max_tokens": budget}
    started = time.perf_counter()
    response = client.post("/v1/context", json=body)
    elapsed_ms = (time.perf_counter() - started) * 1000
    response.raise_for_status()
    built = response.json()
    prompt = PromptText(without_summaries("\n".join(str(m.get("content") or "") for m in built["messages"])))
    anywhere, answering = prompt_evidence(prompt, question, stored)
    for source, quoted_any, quoted_answer in zip(sources, anywhere, answering, strict=True):
        source[f"any@{budget}"], source[f"answer@{budget}"] = quoted_any, quoted_answer
    return {
        f"context_ms@{budget}": elapsed_ms,
        f"any@{budget}": sum(anywhere) / len(anywhere),
        f"answer@{budget}": sum(answering) / len(answering),
        f"memory tokens@{budget}": built["usage"]["sections"]["memory"]["tokens"],
        f"summaries@{budget}": sum(hit.get("kind") == "summary" for hit in built["recalled"]),
        f"total tokens@{budget}": built["usage"]["total_tokens"],
    }


def ask(client: httpx.Client, stored: Stored, number: int, question: Question, budgets: list[int], top_k: int) -> dict:
    """Search, and a context per budget, for one question; its row."""
    row: dict = {"ability": question.ability, "question": question.text, "sources": source_details(question, stored.by_id)}
    row.update(search(client, stored, question, top_k))
    for source in row["sources"]:
        ranked = row["defaults ranked"]
        source["rank"] = ranked.index(source["id"]) if source["id"] in ranked else None
        source["refused"] = source["id"] in stored.ingested.refused
    for budget in budgets:
        row.update(context(client, stored, question, f"{stored.user}-q{number}", budget, row["sources"]))
    return row


def run_service(
    client: httpx.Client,
    conversations: list[Conversation],
    budgets: list[int],
    top_k: int,
    run: str,
    reuse: bool = False,
    candidates: TextIO | None = None,
) -> tuple[list[dict], dict]:
    """Each conversation ingested as its own user, memorized, then asked its questions. `reuse`:
    the run's users hold the conversations already; `candidates`: every question's explained
    search is written there, a JSON line each, for `bench.rerank_fit --candidates`."""
    rows, ingest_figures = [], {}
    for conversation in conversations:
        user = f"beam-{conversation.name}-{run}"
        if reuse:
            ingested = already_ingested(conversation, user)
        else:
            ingested = ingest(client, conversation, user)
        ingest_figures[conversation.name] = {
            "messages": ingested.messages, "chars": ingested.chars, "refused": ingested.refused,
            "append_s": ingested.append_s, "searchable_s": ingested.searchable_s,
        }  # fmt: skip
        print(f"{conversation.name}: {ingested.messages} messages ({ingested.chars:,} characters) searchable in "
              f"{ingested.searchable_s:.0f} s; refused {ingested.refused or 'none'}")  # fmt: skip
        stored = Stored.of(user, ingested, conversation)
        for number, question in enumerate(tqdm(conversation.questions, desc=f"questions {conversation.name}", unit="q")):
            rows.append({"conversation": conversation.name, **ask(client, stored, number, question, budgets, top_k)})
            if candidates is not None:
                candidates.write(json.dumps(explained_candidates(client, stored, conversation.name, question)) + "\n")
        rows += [{"conversation": conversation.name, **row} for row in ask_unrelated(client, stored, budgets)]
    return rows, ingest_figures


def explained_candidates(client: httpx.Client, stored: Stored, conversation: str, question: Question) -> dict:
    """A question's search explained: every candidate of either side, with the scores the second
    stage's features are made of, its text, the message it is of and whether the floors passed it
    (those are what the second stage ranks)."""
    body = {"query": question.text, "top_k": 100, "explain": True}
    response = client.post(f"/v1/users/{stored.user}/memories/search", json=body)
    response.raise_for_status()
    candidates = response.json()["candidates"]
    for c in candidates:
        c["message"] = stored.ingested.where.get((c["session_id"], c["seq"]))
        c["passed"] = c["reason"] in KEPT_REASONS
    return {"conversation": conversation, "question": question.text, "sources": list(question.sources), "candidates": candidates}


def ask_unrelated(client: httpx.Client, stored: Stored, budgets: list[int]) -> list[dict]:
    """The memory tokens each budget's prompt gives a question the conversation does not answer."""
    rows = []
    for number, text in enumerate(UNRELATED):
        row: dict = {"unrelated": text}
        for budget in budgets:
            body = {"user_id": stored.user, "session_id": f"{stored.user}-u{number}", "query": text, "max_tokens": budget}
            response = client.post("/v1/context", json=body)
            response.raise_for_status()
            row[f"memory tokens@{budget}"] = response.json()["usage"]["sections"]["memory"]["tokens"]
        rows.append(row)
    return rows


def unrelated_share(rows: list[dict], budgets: list[int]) -> dict:
    """Memory tokens an unrelated question's prompt gets, and their share of an answerable one's."""
    unrelated = [r for r in rows if "unrelated" in r]
    answerable = [r for r in rows if "unrelated" not in r]
    out: dict = {"questions": len(unrelated)}
    for budget in budgets:
        key = f"memory tokens@{budget}"
        spent = statistics.fmean(r[key] for r in unrelated) if unrelated else float("nan")
        wanted = statistics.fmean(r[key] for r in answerable) if answerable else float("nan")
        out[key] = spent
        out[f"share@{budget}"] = spent / wanted if wanted else float("nan")
    return out


def run_dense(conversations: list[Conversation]) -> list[dict]:
    """One vector per whole message with the bundled model, cosine top k per question."""
    import numpy as np

    from serve_app.encoding.sentence import SentenceEncoder
    from serve_app.settings import Settings

    encoder = SentenceEncoder(int8=Settings().embedding_int8, trace_single=False)
    rows = []
    for conversation in conversations:
        texts = [m.content for m in conversation.messages]
        vectors = np.vstack([
            np.asarray(encoder.encode(texts[i : i + 64]), dtype=np.float32)
            for i in tqdm(range(0, len(texts), 64), desc=f"encode {conversation.name}", unit="batch")
        ])  # fmt: skip
        ids = [m.id for m in conversation.messages]
        by_id = {m.id: m for m in conversation.messages}
        for question in conversation.questions:
            started = time.perf_counter()
            scores = vectors @ np.asarray(encoder.encode([question.text])[0], dtype=np.float32)
            ranked = [ids[i] for i in np.argsort(-scores)[: max(KS)]]
            row = {"conversation": conversation.name, "ability": question.ability, "question": question.text,
                   "sources": source_details(question, by_id), "dense search_ms": (time.perf_counter() - started) * 1000,
                   "dense ranked": ranked, **recall_row(ranked, question.sources, "dense ")}  # fmt: skip
            for source in row["sources"]:
                source["rank"] = ranked.index(source["id"]) if source["id"] in ranked else None
            rows.append(row)
    return rows


def mean(rows: list[dict], key: str) -> float:
    return statistics.fmean(r[key] for r in rows) if rows else float("nan")


def by_length(rows: list[dict], budgets: list[int]) -> dict[str, dict[str, float]]:
    """Source messages pooled by size: the share found in the first 10 and quoted in the prompt."""
    sources = [s for r in rows for s in r["sources"]]
    out = {}
    for low, high in LENGTHS:
        group = [s for s in sources if low <= s["chars"] < high]
        name = f"{low}-{high} chars" if high < 10**9 else f">= {low} chars"
        figures: dict[str, float] = {"sources": len(group)}
        if group:
            figures["found@10"] = statistics.fmean(s["rank"] is not None and s["rank"] < 10 for s in group)
            for budget in budgets:
                if f"any@{budget}" in group[0]:
                    figures[f"any@{budget}"] = statistics.fmean(s[f"any@{budget}"] for s in group)
                    figures[f"answer@{budget}"] = statistics.fmean(s[f"answer@{budget}"] for s in group)
        out[name] = figures
    return out


def summarize(rows: list[dict], modes: Iterable[str], budgets: list[int]) -> dict:
    """Per ability and all: recall@k per mode, evidence in the prompt both ways per budget."""
    keys = [f"{mode} recall@{k}" for mode in modes for k in KS]
    keys += [f"{what}@{b}" for b in budgets for what in ("any", "answer", "memory tokens", "total tokens", "summaries")]

    def figures(group: list[dict]) -> dict:
        # A question naming more than 10 messages cannot reach recall@10 = 1: the most it can reach.
        ceiling = statistics.fmean(min(1.0, 10 / len(r["sources"])) for r in group) if group else float("nan")
        return {
            "questions": len(group),
            "recall@10 ceiling": ceiling,
            **{key: mean(group, key) for key in keys if group and key in group[0]},
        }

    groups = {"all": rows, **{name: [r for r in rows if r["ability"] == ability] for ability, name in ABILITIES.items()}}
    out: dict = {"by_ability": {name: figures(group) for name, group in groups.items() if group}}
    out["by_conversation"] = {
        c: figures([r for r in rows if r["conversation"] == c]) for c in dict.fromkeys(r["conversation"] for r in rows)
    }
    out["by_source_length"] = by_length(rows, budgets)
    out["search_p50_ms"] = {mode: percentile([r[f"{mode} search_ms"] for r in rows], 50) for mode in modes}
    return out


def ingest_totals(ingest_figures: dict) -> dict:
    messages = sum(f["messages"] for f in ingest_figures.values())
    chars = sum(f["chars"] for f in ingest_figures.values())
    seconds = sum(f["searchable_s"] for f in ingest_figures.values())
    refused = sum(len(f["refused"]) for f in ingest_figures.values())
    per_s = 1 / seconds if seconds else float("nan")  # nan: a --reuse run ingested nothing
    return {"messages": messages, "chars": chars, "refused": refused, "searchable_s": seconds,
            "messages_per_s": messages * per_s, "chars_per_s": chars * per_s}  # fmt: skip


def table(figures: dict, mode: str, budgets: list[int]) -> str:
    """The per-ability table, markdown."""
    head = ["ability", "questions", "recall@10"]
    if mode != "dense":
        head += [f"{what} @{b}" for b in budgets for what in ("any passage", "answer passage")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, row in figures["by_ability"].items():
        cells = [name, str(row["questions"]), f"{row[f'{mode} recall@10']:.3f}"]
        if mode != "dense":
            cells += [f"{row[f'{what}@{b}']:.3f}" for b in budgets for what in ("any", "answer")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(figures: dict, modes: list[str], budgets: list[int]) -> None:
    for mode in modes:
        print(f"\n{mode}: recall@k " + ", ".join(f"@{k} {figures['by_ability']['all'][f'{mode} recall@{k}']:.3f}" for k in KS))
        print(table(figures, mode, budgets))
    print("\nsource messages by length: found in the first 10 (shipped defaults or dense), quoted in the prompt")
    for name, row in figures["by_source_length"].items():
        print(f"  {name:<16}" + "  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
    print("search p50 " + ", ".join(f"{mode} {ms:.1f} ms" for mode, ms in figures["search_p50_ms"].items()))
    everyone = figures["by_ability"]["all"]
    if f"summaries@{budgets[0]}" in everyone:
        counts = ", ".join(f"@{b} {everyone[f'summaries@{b}']:.2f}" for b in budgets)
        print(f"summary memories per prompt (not counted as evidence): {counts}")
    if "unrelated" in figures:
        spent = figures["unrelated"]
        shares = (f"@{b} {spent[f'memory tokens@{b}']:.0f} ({spent[f'share@{b}']:.1%} of an answerable one's)" for b in budgets)
        print("unrelated questions' memory tokens: " + ", ".join(shares))
    if "ingest" in figures:
        total = figures["ingest"]
        print(
            f"ingest: {total['messages']} messages, {total['chars']:,} characters searchable in {total['searchable_s']:.0f} s "
            f"({total['messages_per_s']:.2f} messages/s, {total['chars_per_s']:,.0f} characters/s); refused {total['refused']}"
        )


def load(data: Path, names: list[str] | None, limit: int | None) -> list[Conversation]:
    return [truncated(load_conversation(folder), limit) for folder in conversation_folders(data, names)]


def measure(
    args: argparse.Namespace, conversations: list[Conversation], budgets: list[int]
) -> tuple[list[dict], dict, list[str]]:
    """The rows, the figures and the modes of the run the arguments ask for."""
    if args.dense_baseline:
        rows = run_dense(conversations)
        return rows, summarize(rows, ["dense"], budgets), ["dense"]
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    with (
        httpx.Client(base_url=args.url, timeout=300, headers=headers) as client,
        args.candidates.open("w") if args.candidates else nullcontext() as candidates,
    ):
        rows, ingest_figures = run_service(client, conversations, budgets, args.top_k, args.run_id, args.reuse, candidates)
    figures = summarize([r for r in rows if "unrelated" not in r], list(MODES), budgets)
    figures["unrelated"] = unrelated_share(rows, budgets)
    figures["ingest"] = ingest_totals(ingest_figures)
    figures["ingest_by_conversation"] = ingest_figures
    return rows, figures, list(MODES)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, nargs="?", default=default_data_dir(), help="Folder of numbered BEAM conversations.")
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--api-key", default="", help="Bearer key when the service requires one.")
    parser.add_argument("--conversations", nargs="+", help="Only these conversations (folder names, e.g. 1 2).")
    parser.add_argument("--limit-messages", type=int, help="Only the first N messages of each (a quick run, not a figure).")
    parser.add_argument("--budgets", default="2048,8192", help="max_tokens of the context calls, comma-separated.")
    parser.add_argument("--top-k", type=int, default=50, help="Hits a search asks for (recall@k counts distinct messages).")
    parser.add_argument("--dense-baseline", action="store_true", help="Dense search over whole messages in process, no service.")
    parser.add_argument("--out", type=Path, default=Path("bench/out/beam.json"))
    parser.add_argument("--run-id", default=uuid.uuid4().hex[:6], help="Names the run's users (beam-<conversation>-<run id>).")
    parser.add_argument("--reuse", action="store_true", help="The run's users hold the conversations already: ask only.")
    parser.add_argument(
        "--candidates", type=Path, help="Also write each question's explained search here (JSON lines), for bench.rerank_fit."
    )
    args = parser.parse_args(argv)
    budgets = [int(b) for b in args.budgets.split(",")]
    conversations = load(args.data, args.conversations, args.limit_messages)
    rows, figures, modes = measure(args, conversations, budgets)
    report(figures, modes, budgets)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"data": str(args.data), "conversations": [c.name for c in conversations], "limit_messages": args.limit_messages,
            "mode": "dense baseline" if args.dense_baseline else args.url, "budgets": budgets, "top_k": args.top_k}  # fmt: skip
    args.out.write_text(json.dumps({**meta, "figures": figures, "questions": rows}, indent=1))


if __name__ == "__main__":
    main()
