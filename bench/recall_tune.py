"""Tune hybrid recall with leave-one-file-out on LoCoMo conversations, in process, with the service's
own keyword normalization, fusion and Milvus (Lite) stores: no HTTP, so a grid runs in a minute.

    python -m bench.recall_tune ../shared/data/locomo --json bench/out/recall_tune.json

For each held-out file, the grid point that is best on the other files is scored on the held-out
one and compared with plain RRF (dense + BM25 over the raw turn text, k=60, equal weights, no
context, no stemming) and with the shipped defaults. Each file is one user; all files share one
collection, so every search runs among other users' rows. Then the keyword coverage floor, with
the floors on as a context uses them, left out the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import statistics
import tempfile
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from tqdm import tqdm

from bench.locomo_data import CATEGORIES, Question, Turn, questions_of, recall_at, turns_of
from serve_app.core.keywords import memory_keywords, query_terms
from serve_app.core.ranking import Fused, FusionParams, Scored, fuse
from serve_app.core.records import Hit, MemoryRow
from serve_app.core.timeframe import query_timeframe
from serve_app.embedded.launchers import EmbeddedBackends, Ports
from serve_app.encoding.sentence import SentenceEncoder
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores

K = 10
CANDIDATES = 50
PLAIN = "plain"  # keyword variant: raw text, raw query


@dataclass(frozen=True)
class Variant:
    """How the keyword side is indexed."""

    context_turns: int
    self_weight: int

    @property
    def name(self) -> str:
        return f"ctx{self.context_turns}w{self.self_weight}"


@dataclass
class Conversation:
    name: str
    turns: list[Turn]
    questions: list[Question]
    dense: list[list[Hit]]
    keyword: dict[str, list[list[Hit]]]


def keyword_text(turns: list[Turn], index: int, variant: Variant | None) -> str:
    turn = turns[index]
    if variant is None:
        return raw_terms(turn.content)
    before = [t.content for t in turns[max(0, index - variant.context_turns) : index] if t.session == turn.session]
    return memory_keywords(
        turn.content,
        before=before[-variant.context_turns :] if variant.context_turns else [],
        day=turn.when.date(),
        weight=variant.self_weight,
    )


async def index_and_search(
    files: list[Path], variants: list[Variant], encoder: SentenceEncoder, env: dict, *, whole_text: bool = False
) -> list[Conversation]:
    """Dense rows under tenant `bench`, embedded as the service embeds memories (`whole_text`: each
    text alone, the document embedding before sentences); each keyword variant is indexed under a
    tenant of its own."""
    stores = await Stores.connect(Settings(**env, milvus_collection="tune"))
    conversations = []
    try:
        for path in tqdm(files, desc="index", unit="file"):
            data = json.loads(path.read_text())
            turns, questions = turns_of(data), questions_of(data)
            embed = encoder.encode if whole_text else encoder.encode_documents
            vectors = embed([t.content for t in turns])
            query_vectors = encoder.encode([q.text for q in questions])
            user = path.stem
            for variant in [None, *variants]:
                tenant = variant.name if variant else PLAIN
                rows = [
                    MemoryRow(
                        f"{user}-{i}",
                        tenant,
                        user,
                        f"s{t.session}",
                        t.seq,
                        t.role,
                        "turn",
                        t.content,
                        int(t.when.timestamp() * 1000),
                        vectors[i],
                        keyword_text(turns, i, variant),
                    )
                    for i, t in enumerate(turns)
                ]
                await stores.keywords.upsert(rows)
                if variant is None:
                    await stores.vectors.upsert([replace(r, tenant_id="bench") for r in rows])
            await stores.vectors.flush()
            dense = [await stores.vectors.search_dense("bench", user, v, limit=CANDIDATES) for v in query_vectors]
            # Plain BM25: the raw lowercased words on both sides (no stems, no stop words, no context).
            keyword = {PLAIN: [await stores.keywords.search(PLAIN, user, raw_terms(q.text), limit=CANDIDATES) for q in questions]}
            for variant in variants:
                keyword[variant.name] = [
                    await stores.keywords.search(variant.name, user, query_terms(q.text), limit=CANDIDATES) for q in questions
                ]
            conversations.append(Conversation(path.name, turns, questions, dense, keyword))
    finally:
        await stores.close()
    return conversations


def raw_terms(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


def _created(hit: Hit) -> datetime:
    return datetime.fromtimestamp(hit.created_at_ms / 1000, tz=UTC)


@dataclass
class Candidates:
    """One question's first stage: what fusion keeps, both sides' lists, each candidate's hit and turn."""

    fused: list[Fused]
    dense: list[Scored]
    keyword: list[Scored]
    hits: dict[str, Hit]
    dia: dict[str, str]


def fused_candidates(conv: Conversation, qi: int, variant: str, params: FusionParams, use_time: bool = True) -> Candidates:
    dense_hits, keyword_hits = conv.dense[qi], conv.keyword[variant][qi]
    hits = {h.id: h for h in (*dense_hits, *keyword_hits)}
    dense = [Scored(h.id, h.score, _created(h)) for h in dense_hits]
    keyword = [Scored(h.id, h.score, _created(h), h.coverage) for h in keyword_hits]
    fused = fuse(dense, keyword, params, query_timeframe(conv.questions[qi].text) if use_time else None)
    by_seq = {(f"s{t.session}", t.seq): t.dia_id for t in conv.turns}
    return Candidates(fused, dense, keyword, hits, {i: by_seq[(h.session_id, h.seq)] for i, h in hits.items()})


def ranked_dia(conv: Conversation, qi: int, variant: str, params: FusionParams, use_time: bool) -> list[str]:
    found = fused_candidates(conv, qi, variant, params, use_time)
    return [found.dia[f.id] for f in found.fused]


def score(convs: list[Conversation], variant: str, params: FusionParams, use_time: bool = True) -> dict[str, float]:
    out = {}
    for conv in convs:
        values = [
            recall_at(ranked_dia(conv, qi, variant, params, use_time), q.evidence, K) for qi, q in enumerate(conv.questions)
        ]
        out[conv.name] = statistics.fmean(values)
    return out


def coverage_floor_left_out(convs: list[Conversation], variant: str, shipped: FusionParams, settings: Settings) -> dict:
    """The keyword coverage floor, floors on as a context uses them: for each held-out file, the
    value best on the others, scored on it, per category; beside it, no coverage floor."""
    floors = replace(shipped, min_similarity=settings.recall_min_score, min_keyword_share=settings.recall_min_keyword_share)
    values = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6)

    def rows(conv: Conversation, value: float) -> list[tuple[int, float]]:
        params = replace(floors, min_keyword_coverage=value)
        questions = enumerate(conv.questions)
        return [(q.category, recall_at(ranked_dia(conv, qi, variant, params, True), q.evidence, K)) for qi, q in questions]

    per_question = {value: {conv.name: rows(conv, value) for conv in convs} for value in values}
    names = [c.name for c in convs]
    held_out: list[tuple[int, float]] = []
    chosen = {}
    for held in names:
        others = [n for n in names if n != held]
        best = max(values, key=lambda v: statistics.fmean(r for n in others for _, r in per_question[v][n]))
        chosen[held] = best
        held_out += per_question[best][held]

    def by_cat(rows: list[tuple[int, float]]) -> dict[str, float]:
        return {"all": statistics.fmean(r for _, r in rows)} | {
            CATEGORIES[c]: statistics.fmean(r for cat, r in rows if cat == c) for c in CATEGORIES
        }

    return {
        "chosen": chosen,
        "held_out": by_cat(held_out),
        "no_floor": by_cat([row for n in names for row in per_question[0.0][n]]),
        "in_sample": {v: by_cat([row for n in names for row in per_question[v][n]])["all"] for v in values},
    }


def by_category(convs: list[Conversation], variant: str, params: FusionParams) -> dict[str, float]:
    rows: dict[int, list[float]] = {c: [] for c in CATEGORIES}
    for conv in convs:
        for qi, q in enumerate(conv.questions):
            rows[q.category].append(recall_at(ranked_dia(conv, qi, variant, params, True), q.evidence, K))
    return {CATEGORIES[c]: statistics.fmean(v) for c, v in rows.items() if v}


VARIANTS = [Variant(c, w) for c in (0, 1, 2, 3) for w in (1, 2)]
GridPoint = tuple[str, FusionParams]


def fusion_grid() -> list[GridPoint]:
    """Every keyword variant with every fusion setting tried, floors off."""
    return [
        (v.name, FusionParams(dense_weight=dw, keyword_weight=1.0, time_weight=tw, rrf_k=k, min_similarity=-1))
        for v in VARIANTS
        for dw, k, tw in itertools.product((0.35, 0.5, 0.75, 1.0), (10, 20, 40, 60), (0.0, 0.5, 1.0))
    ]


def score_grid(convs: list[Conversation], grid: list[GridPoint]) -> dict[GridPoint, dict[str, float]]:
    return {(name, params): score(convs, name, params) for name, params in tqdm(grid, desc="grid", unit="point")}


def best_on(table: dict[GridPoint, dict[str, float]], files: list[str]) -> GridPoint:
    """The grid point with the best mean recall over `files`."""
    return max(table, key=lambda key: statistics.fmean(table[key][n] for n in files))


def variant_named(name: str) -> Variant:
    return next(v for v in VARIANTS if v.name == name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="Directory of LoCoMo conversation files (*.json).")
    parser.add_argument("--json", dest="json_out", default="bench/out/recall_tune.json")
    args = parser.parse_args()
    files = sorted(args.data.glob("*.json"))
    if len(files) < 2:
        raise SystemExit("leave-one-file-out needs at least two files")

    variants = VARIANTS
    grid = fusion_grid()
    settings = Settings()
    shipped_variant = Variant(settings.recall_keyword_context_turns, settings.recall_keyword_self_weight).name
    shipped = FusionParams(
        dense_weight=settings.recall_dense_weight,
        keyword_weight=settings.recall_keyword_weight,
        time_weight=settings.recall_time_weight,
        rrf_k=settings.recall_rrf_k,
        min_similarity=-1,
    )
    plain = FusionParams(dense_weight=1.0, keyword_weight=1.0, time_weight=0.0, rrf_k=60, min_similarity=-1)
    dense_only = replace(plain, keyword_weight=0.0)

    with tempfile.TemporaryDirectory() as tmp:
        backends = EmbeddedBackends(Path(tmp), Ports.free()).start()
        try:
            convs = asyncio.run(index_and_search(files, variants, SentenceEncoder(int8=settings.embedding_int8), backends.env))
        finally:
            backends.stop()

    table = score_grid(convs, grid)
    names = [c.name for c in convs]
    baseline = score(convs, PLAIN, plain, use_time=False)
    defaults = score(convs, shipped_variant, shipped)
    dense_alone = score(convs, PLAIN, dense_only, use_time=False)
    keyword_alone = score(convs, PLAIN, replace(plain, dense_weight=0.0), use_time=False)

    rows = []
    print(f"\nleave-one-file-out, recall@{K}")
    print(f"{'held out':<10}{'plain RRF':>10}{'tuned':>8}{'gain':>8}{'shipped':>9}   tuned on the others")
    for held in names:
        others = [n for n in names if n != held]
        best = best_on(table, others)
        tuned = table[best][held]
        rows.append(
            {
                "held_out": held,
                "plain_rrf": baseline[held],
                "tuned": tuned,
                "gain": tuned - baseline[held],
                "shipped": defaults[held],
                "variant": best[0],
                "dense_weight": best[1].dense_weight,
                "rrf_k": best[1].rrf_k,
                "time_weight": best[1].time_weight,
            }
        )
        print(
            f"{held:<10}{baseline[held]:>10.3f}{tuned:>8.3f}{tuned - baseline[held]:>+8.3f}{defaults[held]:>9.3f}   "
            f"{best[0]} dense_weight={best[1].dense_weight} rrf_k={best[1].rrf_k:g} time_weight={best[1].time_weight}"
        )
    mean = statistics.fmean
    print(
        f"{'mean':<10}{mean(baseline.values()):>10.3f}{mean(r['tuned'] for r in rows):>8.3f}"
        f"{mean(r['gain'] for r in rows):>+8.3f}{mean(defaults.values()):>9.3f}"
    )
    print(
        f"\nall files, recall@{K}: dense alone {mean(dense_alone.values()):.3f}, BM25 alone {mean(keyword_alone.values()):.3f}, "
        f"plain RRF {mean(baseline.values()):.3f}, shipped defaults {mean(defaults.values()):.3f}"
    )
    categories = by_category(convs, shipped_variant, shipped)
    print("shipped defaults by category: " + ", ".join(f"{k} {v:.3f}" for k, v in categories.items()))
    coverage = coverage_floor_left_out(convs, shipped_variant, shipped, settings)
    print(f"\nkeyword coverage floor, floors on, recall@{K}: chosen on the other files {coverage['chosen']}")
    for name in ("held_out", "no_floor"):
        print(f"{name:<10}" + ", ".join(f"{k} {v:.3f}" for k, v in coverage[name].items()))
    print("in-sample by value: " + ", ".join(f"{v:g}: {r:.3f}" for v, r in coverage["in_sample"].items()))
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "k": K,
                "leave_one_out": rows,
                "plain_rrf": baseline,
                "shipped": defaults,
                "dense_alone": dense_alone,
                "bm25_alone": keyword_alone,
                "shipped_by_category": categories,
                "coverage_floor": coverage,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
