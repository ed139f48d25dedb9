"""Compression quality on seeded synthetic support dialogs, measured against what the generator planted.

    python -m bench.compression                       # extractive summary (no LLM)
    python -m bench.compression --openai-url http://127.0.0.1:8001/v1 --model tiny-qwen

For each mode it compacts a 100-turn dialog with the service's own summarizer (everything but the
newest rounds) and prints tokens before and after, the ratio, and how many of the details the
generator planted in the compacted turns the summary still holds, by kind. Ground truth comes from
the generator, not from the summarizer's own key-item pattern: besides the kinds that pattern knows
(order ids, amounts, dates, ticket numbers, tool parameters) it plants kinds it does not know
(customer names, street addresses, spelled-out quantities, amounts written with a thousands
separator and a currency word). Also prints whether associations survive (an order id within reach
of its amount) and the pinned details' tokens. Writes a PNG next to --json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from serve_app.core.budget import group_blocks
from serve_app.core.compression import SummaryState, plan_compaction
from serve_app.core.tokenizer import count_block, count_tokens
from serve_app.llm.client import OpenAIChatClient
from serve_app.services.summarizer import Summarizer

STATUSES = ["shipped", "delayed", "refunded", "in transit", "delivered"]
FIRST = ["Ingrid", "Tomasz", "Amara", "Kenji", "Lucia", "Omar", "Freya", "Dmitri", "Noor", "Mateo"]
LAST = ["Solberg", "Kowalski", "Okafor", "Tanaka", "Ferreira", "Haddad", "Lindqvist", "Petrov", "Rahman", "Alvarez"]
STREETS = ["Rue Lepic", "Baker Street", "Calle Mayor", "Via Roma", "Karl-Marx-Allee", "Elm Avenue"]
CITIES = ["Paris", "London", "Madrid", "Rome", "Berlin", "Springfield"]
SPELLED = ["two", "three", "four", "five", "six", "seven", "eight", "nine", "eleven", "twelve"]
KNOWN_TO_THE_PATTERN = ("order id", "amount", "date", "ticket", "tool parameter")
UNKNOWN_TO_THE_PATTERN = ("name", "address", "spelled-out quantity", "amount in words and separators")


@dataclass
class Planted:
    kind: str
    text: str
    seq: int


def make_dialog(seed: int, turns: int = 100) -> tuple[list[dict], list[Planted], list[tuple[str, str]]]:
    """A support dialog; returns the messages (with seq), every detail planted in them, and the
    (order id, amount) pairs."""
    rng = random.Random(seed)
    messages: list[dict] = []
    planted: list[Planted] = []
    pairs: list[tuple[str, str]] = []

    def add(plants: list[tuple[str, str]] = (), **message) -> None:
        seq = len(messages) + 1
        messages.append({"seq": seq, **message})
        planted.extend(Planted(kind, text, seq) for kind, text in plants)

    while len(messages) < turns:
        order = f"ORD-{rng.randint(10000, 99999)}"
        amount = f"${rng.randint(5, 900)}.{rng.randint(0, 99):02d}"
        day = f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
        address = f"{rng.randint(2, 240)} {rng.choice(STREETS)}, {rng.choice(CITIES)}"
        boxes = rng.choice(SPELLED)
        pairs.append((order, amount))
        add(
            [("name", name), ("order id", order), ("amount", amount), ("date", day), ("spelled-out quantity", boxes),
             ("address", address)],
            role="user",
            content=f"Hi, this is {name}. Order {order} for {amount} placed on {day} has not arrived. "
            f"It was {boxes} boxes, to be delivered to {address}. Can you check?",
        )  # fmt: skip
        warehouse = f"WH-{rng.randint(10, 99)}"
        args = json.dumps({"order_id": order, "warehouse": warehouse, "include": ["status", "eta"]})
        add(
            [("tool parameter", warehouse)],
            role="assistant",
            content="",
            tool_calls=[
                {"id": f"call_{len(messages)}", "type": "function", "function": {"name": "lookup_order", "arguments": args}}
            ],
        )
        eta = f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        add(
            role="tool",
            name="lookup_order",
            content=json.dumps({"order_id": order, "status": rng.choice(STATUSES), "eta": eta, "amount": amount}),
        )
        add([("date", eta)], role="assistant", content=f"Order {order} ({amount}) is {rng.choice(STATUSES)}; expected by {eta}.")
        if rng.random() < 0.5:
            ticket = f"T{rng.randint(100, 999)}"
            big = f"{rng.randint(1, 9)},{rng.randint(100, 999)}.{rng.randint(0, 99):02d} euros"
            add(
                [("ticket", ticket), ("amount in words and separators", big)],
                role="user",
                content=f"Thanks. Please note ticket {ticket}; the whole shipment is insured for {big} if it is lost.",
            )
    kept = messages[:turns]
    return kept, [p for p in planted if p.seq <= turns], pairs


def associated(summary: str, order: str, amount: str, reach: int = 80) -> bool:
    for match in re.finditer(re.escape(order), summary):
        window = summary[max(0, match.start() - reach) : match.end() + reach]
        if amount in window:
            return True
    return False


@dataclass
class Row:
    mode: str
    seed: int
    tokens_before: int
    tokens_after: int
    ratio: float
    pinned_tokens: int
    associations: float
    within_budget: bool
    degraded: bool
    kept: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per kind of planted detail: (still in the summary, planted in the compacted turns)."""

    def share(self, kinds: tuple[str, ...]) -> float:
        found = sum(self.kept.get(k, (0, 0))[0] for k in kinds)
        return found / max(1, sum(self.kept.get(k, (0, 0))[1] for k in kinds))


async def run_mode(name: str, summarizer: Summarizer, seed: int, budget: int, keep_rounds: int) -> Row:
    dialog, planted, pairs = make_dialog(seed)
    before = sum(count_block(b) for b in group_blocks(dialog))
    target = plan_compaction(dialog, before, trigger_tokens=0, keep_rounds=keep_rounds, force=True)
    span = [m for m in dialog if m["seq"] <= target]
    tail = [m for m in dialog if m["seq"] > target]
    outcome = await summarizer.summarize(SummaryState(), "", span, target)
    text = outcome.text
    pinned_text = text.split("\nPinned details: ", 1)[1] if outcome.pinned else ""
    kept: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for item in {(p.kind, p.text) for p in planted if p.seq <= target}:
        kept[item[0]][1] += 1
        kept[item[0]][0] += int(item[1].lower() in text.lower())
    after = count_tokens(text) + sum(count_block(b) for b in group_blocks(tail))
    span_pairs = [(o, a) for o, a in pairs if any(o in (m.get("content") or "") for m in span)]
    return Row(
        mode=name,
        seed=seed,
        tokens_before=before,
        tokens_after=after,
        ratio=round(before / max(1, after), 2),
        pinned_tokens=count_tokens(pinned_text) if pinned_text else 0,
        associations=round(sum(associated(text, o, a) for o, a in span_pairs) / max(1, len(span_pairs)), 3),
        within_budget=after <= budget,
        degraded=outcome.degraded,
        kept={k: (v[0], v[1]) for k, v in kept.items()},
    )


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = sorted({r.mode for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for mode in modes:
        mine = [r for r in rows if r.mode == mode]
        axes[0].scatter([r.tokens_before for r in mine], [r.tokens_after for r in mine], label=mode)
        axes[1].bar(
            [f"{mode}\nknown kinds", f"{mode}\nother kinds", f"{mode}\nassoc."],
            [
                sum(r.share(KNOWN_TO_THE_PATTERN) for r in mine) / len(mine),
                sum(r.share(UNKNOWN_TO_THE_PATTERN) for r in mine) / len(mine),
                sum(r.associations for r in mine) / len(mine),
            ],
        )
    axes[0].axhline(2000, linestyle="--", color="grey", label="2,000-token target")
    axes[0].set_xlabel("tokens before")
    axes[0].set_ylabel("summary + recent turns")
    axes[0].legend()
    axes[1].set_ylim(0, 1.05)
    axes[1].set_title("planted details kept")
    axes[1].tick_params(axis="x", labelrotation=35, labelsize=8)
    fig.tight_layout()
    fig.savefig(path)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget", type=int, default=2000)
    parser.add_argument("--keep-rounds", type=int, default=2)
    parser.add_argument("--summary-max-tokens", type=int, default=512)
    parser.add_argument("--openai-url", help="OpenAI-compatible endpoint to test the LLM mode against.")
    parser.add_argument("--model", default="qwen2.5-7b-instruct")
    parser.add_argument("--llm-input-tokens", type=int, default=6000)
    parser.add_argument("--json", dest="json_out", default="bench/out/compression.json")
    args = parser.parse_args()

    modes = {"extractive": Summarizer(None, summary_max_tokens=args.summary_max_tokens)}
    if args.openai_url:
        client = OpenAIChatClient(args.openai_url, args.model, timeout_s=300)
        modes["llm (openai)"] = Summarizer(
            client, summary_max_tokens=args.summary_max_tokens, llm_input_tokens=args.llm_input_tokens
        )
    rows = []
    for name, summarizer in modes.items():
        for seed in tqdm(range(args.seeds), desc=name, unit="dialog"):
            rows.append(await run_mode(name, summarizer, seed, args.budget, args.keep_rounds))

    header = f"{'mode':<14}{'seed':>5}{'before':>8}{'after':>7}{'ratio':>7}{'known':>7}{'other':>7}{'pin tok':>8}{'assoc':>7}"
    print(header + f"{'<=budget':>9}")
    for r in rows:
        print(
            f"{r.mode:<14}{r.seed:>5}{r.tokens_before:>8}{r.tokens_after:>7}{r.ratio:>7}{r.share(KNOWN_TO_THE_PATTERN):>7.1%}"
            f"{r.share(UNKNOWN_TO_THE_PATTERN):>7.1%}{r.pinned_tokens:>8}{r.associations:>7.1%}{str(r.within_budget):>9}"
        )
    print("\nplanted details still in the summary, by kind, over every seed (kept / planted in the compacted turns)")
    for mode in modes:
        mine = [r for r in rows if r.mode == mode]
        for kind in KNOWN_TO_THE_PATTERN + UNKNOWN_TO_THE_PATTERN:
            found, total = (sum(r.kept.get(kind, (0, 0))[i] for r in mine) for i in (0, 1))
            known = "pattern knows it" if kind in KNOWN_TO_THE_PATTERN else "pattern does not know it"
            print(f"  {mode:<14}{kind:<34}{found:>5} / {total:<5}{found / max(1, total):>7.1%}  ({known})")
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    plot(rows, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    asyncio.run(main())
