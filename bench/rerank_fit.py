"""Fit the second-stage ranking model (serve_app/core/rerank.py) on LoCoMo conversations and long
ones, and score it leave-one-conversation-out against rank fusion alone, per category and corpus.

    python -m bench.rerank_fit ../shared/data/locomo --candidates bench/out/beam-candidates.jsonl \
        --json bench/out/rerank_fit.json

Long conversations come as `bench.beam --candidates` wrote them (each question's explained search
over HTTP, bench/rerank_candidates.py); each is held out like a LoCoMo file. The second stage is
two models (`SecondStage`): each question's list is fitted into, and ranked by, the one of its kind
(its median memory short or long), as the service chooses.

In process, like `bench.recall_tune`: the service's keyword normalization, fusion with the shipped
defaults and both floors on (as `/v1/context` and a plain search use them), the real stores, the
features exactly as the service computes them (`rerank.features`). The label of a candidate is
whether its turn is evidence for the question. For each file, a model fitted on the other files
ranks that file's candidates (**held out**); the last line fits all files and prints the model to
ship (its in-sample figures are not the ones to quote); `--model-out` writes it as a file that
`recall_rerank_model` serves, so a model fitted on your own conversations replaces the shipped one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression
from tqdm import tqdm

from bench import rerank_candidates
from bench.locomo_data import CATEGORIES, recall_at
from bench.recall_tune import Conversation, Variant, fused_candidates, index_and_search
from bench.rerank_candidates import LongConversation
from serve_app.core.ranking import FusionParams
from serve_app.core.rerank import FEATURES, RerankModel, SecondStage, features, rerank
from serve_app.embedded.launchers import EmbeddedBackends, Ports
from serve_app.encoding.sentence import SentenceEncoder
from serve_app.services.recall import fusion_params
from serve_app.settings import Settings

KS = (1, 5, 10, 20)
REGULARIZATION = 1.0  # sklearn's C


Lists = list[tuple[list[tuple[float, ...]], list[bool]]]
"""Candidate lists, one per question: each candidate's features and whether it is evidence."""


def locomo_lists(conv: Conversation, variant: str, params: FusionParams) -> Lists:
    """Every question's kept candidates of a LoCoMo file: their features and whether each is evidence."""
    out = []
    for qi, question in enumerate(conv.questions):
        found = fused_candidates(conv, qi, variant, params)
        rows = features(found.fused, found.dense, found.keyword, found.hits)
        out.append((rows, [found.dia[f.id] in question.evidence for f in found.fused]))
    return out


def long_lists(conv: LongConversation) -> Lists:
    return [(q.rows, q.labels) for q in conv.questions]


def fit_model(lists: Lists, without: frozenset[str] = frozenset()) -> RerankModel:
    """Logistic regression on every candidate of these lists; a feature in `without` gets weight 0
    (the model is fitted on the others)."""
    x = np.array([row for rows, _ in lists for row in rows])
    labels = np.array([label for _, ys in lists for label in ys])
    used = [i for i, name in enumerate(FEATURES) if name not in without]
    mean, scale = x.mean(axis=0), x.std(axis=0) + 1e-9
    model = LogisticRegression(C=REGULARIZATION, max_iter=5000).fit(((x - mean) / scale)[:, used], labels)
    weight = np.zeros(len(FEATURES))
    weight[used] = model.coef_[0]
    return RerankModel(
        mean=tuple(round(float(v), 6) for v in mean),
        scale=tuple(round(float(v), 6) for v in scale),
        weight=tuple(round(float(v), 6) for v in weight),
        bias=round(float(model.intercept_[0]), 6),
        low=tuple(round(float(v), 6) for v in x.min(axis=0)),
        high=tuple(round(float(v), 6) for v in x.max(axis=0)),
    )


def fit_stage(lists: Lists, without: frozenset[str] = frozenset()) -> SecondStage:
    """The two models, each fitted on the lists it will rank (`SecondStage.model_for` decides, as
    the service does); a kind with no list gets the other's model."""
    kinds: dict[bool, Lists] = {False: [], True: []}
    for rows, labels in lists:
        if rows:
            kinds[SecondStage.is_long(rows)].append((rows, labels))
    fitted = {long: fit_model(group, without) for long, group in kinds.items() if group}
    return SecondStage(fitted.get(False) or fitted[True], fitted.get(True) or fitted[False])


def fit(
    convs: list[Conversation],
    variant: str,
    params: FusionParams,
    without: frozenset[str] = frozenset(),
    long: Sequence[LongConversation] = (),
) -> SecondStage:
    lists = [item for conv in convs for item in locomo_lists(conv, variant, params)]
    return fit_stage(lists + [item for conv in long for item in long_lists(conv)], without)


def recall_rows(conv: Conversation, variant: str, params: FusionParams, model: SecondStage) -> list[dict]:
    out = []
    for qi, question in enumerate(conv.questions):
        found = fused_candidates(conv, qi, variant, params)
        reranked = rerank(found.fused, found.dense, found.keyword, found.hits, model)
        out.append(
            {
                "category": CATEGORIES[question.category],
                "fusion": [recall_at([found.dia[f.id] for f in found.fused], question.evidence, k) for k in KS],
                "reranked": [recall_at([found.dia[f.id] for f in reranked], question.evidence, k) for k in KS],
            }
        )
    return out


def leave_one_file_out(
    convs: list[Conversation],
    variant: str,
    params: FusionParams,
    without: frozenset[str],
    long: Sequence[LongConversation] = (),
) -> tuple[list[dict], dict[str, dict], list[dict]]:
    """Each conversation (a LoCoMo file, a long conversation) ranked by a model fitted on all the
    others of both kinds: the LoCoMo rows, each conversation's summary, the long conversations' rows."""
    held_out: list[dict] = []
    long_held_out: list[dict] = []
    per_file = {}
    for conv in tqdm([*convs, *long], desc="leave one conversation out", unit="conversation"):
        model = fit([c for c in convs if c is not conv], variant, params, without, [c for c in long if c is not conv])
        if isinstance(conv, LongConversation):
            rows = rerank_candidates.recall_rows(conv, model, KS)
            long_held_out += rows
        else:
            rows = recall_rows(conv, variant, params, model)
            held_out += rows
        per_file[conv.name] = summary(rows)["all"]
    return held_out, per_file, long_held_out


def summary_pairs(before: list[dict], after: list[dict]) -> dict[str, dict]:
    """Reranked recall@k of two runs over the same questions, overall and by category."""
    later = summary(after)
    return {
        name: {"n": row["n"], "before": row["reranked"], "after": later[name]["reranked"]}
        for name, row in summary(before).items()
    }


def report_against_whole_text(before: list[dict], after: list[dict]) -> None:
    """Held-out reranked recall@k on vectors of each whole text alone against the shipped
    sentence-aware ones, over the same questions, with the paired gain's bootstrap intervals."""
    print("\nheld out, reranked: vectors of the whole text alone -> the whole text and its sentences")
    for name, group in summary_pairs(before, after).items():
        cells = "".join(f"{f'{a:.3f} -> {b:.3f}':>16}" for a, b in zip(group["before"], group["after"], strict=True))
        print(f"{name:<13}{group['n']:>5}{cells}")
    # As paired_interval reads rows: "fusion" the baseline, "reranked" the arm compared with it.
    paired = [
        {"fusion": old["reranked"], "reranked": new["reranked"], "category": new["category"]}
        for old, new in zip(before, after, strict=True)
    ]
    intervals = ", ".join(f"R@{k} {low:+.3f} .. {high:+.3f}" for k, (low, high) in zip(KS, paired_intervals(paired), strict=True))
    print(f"paired gain of the sentence-aware vectors, 95% bootstrap over questions: {intervals}")
    for category in CATEGORIES.values():
        low, high = paired_interval([r for r in paired if r["category"] == category], KS.index(10))
        print(f"  {category}: R@10 {low:+.3f} .. {high:+.3f}")


def paired_intervals(rows: list[dict]) -> list[tuple[float, float]]:
    return [paired_interval(rows, i) for i in range(len(KS))]


def summary(rows: list[dict]) -> dict:
    by = {"all": rows} | {c: [r for r in rows if r["category"] == c] for c in CATEGORIES.values()}
    return {
        name: {
            "n": len(group),
            "fusion": [statistics.fmean(r["fusion"][i] for r in group) for i in range(len(KS))],
            "reranked": [statistics.fmean(r["reranked"][i] for r in group) for i in range(len(KS))],
        }
        for name, group in by.items()
        if group
    }


def paired_interval(rows: list[dict], at: int, rounds: int = 2000) -> tuple[float, float]:
    """95% bootstrap interval of the mean paired gain over questions, in recall at KS[at]."""
    gains = [r["reranked"][at] - r["fusion"][at] for r in rows]
    rng = random.Random(0)
    means = sorted(statistics.fmean(rng.choice(gains) for _ in gains) for _ in range(rounds))
    return means[int(0.025 * rounds)], means[int(0.975 * rounds) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="Directory of LoCoMo conversation files (*.json).")
    parser.add_argument("--json", dest="json_out", default="bench/out/rerank_fit.json")
    parser.add_argument(
        "--model-out", type=Path, help="Also write the model fitted on all files here: a file for recall_rerank_model."
    )
    parser.add_argument(
        "--compare-whole-text",
        action="store_true",
        help="Also run it all on vectors of each whole text alone (the document embedding before sentences) and "
        "print the paired held-out gain of the sentence-aware vectors.",
    )
    parser.add_argument(
        "--candidates",
        type=Path,
        nargs="*",
        default=[],
        help="bench.beam --candidates files: long conversations fitted and held out with the LoCoMo files.",
    )
    parser.add_argument("--without", default="", help="Features to leave out, comma-separated (of: " + ", ".join(FEATURES) + ").")
    args = parser.parse_args()
    files = sorted(args.data.glob("*.json"))
    if len(files) < 2:
        raise SystemExit("leave-one-file-out needs at least two files")
    settings = Settings()
    variant = Variant(settings.recall_keyword_context_turns, settings.recall_keyword_self_weight)
    params = fusion_params(settings)  # the floors on, as the service runs them
    with tempfile.TemporaryDirectory() as tmp:
        backends = EmbeddedBackends(Path(tmp), Ports.free()).start()
        try:
            encoder = SentenceEncoder(int8=settings.embedding_int8)
            whole = (
                asyncio.run(index_and_search(files, [variant], encoder, backends.env, whole_text=True))
                if args.compare_whole_text
                else []
            )
            convs = asyncio.run(index_and_search(files, [variant], encoder, backends.env))
        finally:
            backends.stop()

    without = frozenset(args.without.split(",")) if args.without else frozenset()
    long = rerank_candidates.load(args.candidates)
    held_out, per_file, long_held_out = leave_one_file_out(convs, variant.name, params, without, long)
    table = summary(held_out)
    if long_held_out:
        table["long conversations"] = summary(long_held_out)["all"]
    print("\nrecall@k, floors on, each conversation ranked by a model fitted on the others (held out): fusion -> reranked")
    print(f"{'':<19}{'n':>5}" + "".join(f"{f'R@{k}':>16}" for k in KS))
    for name, row in [*table.items(), *per_file.items()]:
        cells = "".join(f"{f'{a:.3f} -> {b:.3f}':>16}" for a, b in zip(row["fusion"], row["reranked"], strict=True))
        print(f"{name[:18]:<19}{row['n']:>5}{cells}")
    intervals = dict(zip(KS, paired_intervals(held_out), strict=True))
    print(
        "paired gain, 95% bootstrap over questions: "
        + ", ".join(f"R@{k} {low:+.3f} .. {high:+.3f}" for k, (low, high) in intervals.items())
    )
    if whole:
        report_against_whole_text(leave_one_file_out(whole, variant.name, params, without)[0], held_out)
    shipped = fit(convs, variant.name, params, without, long)
    print("\nfitted on all conversations (paste into serve_app/core/rerank.py as SHIPPED_SHORT and SHIPPED_LONG):")
    print(f"features: {', '.join(FEATURES)}")
    print(f"short: {shipped.short}\nlong: {shipped.long}")
    if args.model_out:
        args.model_out.write_text(json.dumps(shipped.to_dict(), indent=2))
        print(f"model written to {args.model_out} (serve it with MEMSERVE_RECALL_RERANK_MODEL={args.model_out})")
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "ks": KS,
                "without": sorted(without),
                "held_out": table,
                "intervals": intervals,
                "per_file": per_file,
                "model": shipped.to_dict(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
