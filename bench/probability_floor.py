"""What the context's probability floor (`context_min_probability`) costs and saves, held out.

    python -m bench.probability_floor ../shared/data/locomo

A context takes at most `recall_top_k` memories in the second stage's order, and leaves out those
the second stage gives less than the floor's chance of answering the query. For each file, a model
fitted on the other files (as `bench.rerank_fit` fits them) ranks that file's candidates; per floor
this prints the share of each question's evidence turns among the memories kept (what the prompt
could hold with room for all of them) and the mean number kept, overall and per category. Every
figure is held out: no file is scored by a model that saw it. A floor only ever removes memories,
so for questions about things the conversation never mentions it can only lower their count.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from bench.locomo_data import CATEGORIES
from bench.recall_tune import Variant, fused_candidates, index_and_search
from bench.rerank_fit import fit
from serve_app.core.rerank import rerank
from serve_app.embedded.launchers import EmbeddedBackends, Ports
from serve_app.encoding.sentence import SentenceEncoder
from serve_app.services.recall import fusion_params
from serve_app.settings import Settings

FLOORS = (0.0, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02)


@dataclass
class Ranked:
    """One question's memories as a context would take them: best first, at most top_k."""

    category: str
    evidence: set[str]
    probabilities: list[float]
    turns: list[str]


def held_out_rankings(data: Path, top_k: int) -> list[Ranked]:
    settings = Settings()
    variant = Variant(settings.recall_keyword_context_turns, settings.recall_keyword_self_weight)
    params = fusion_params(settings)  # the floors on, as the service runs them
    files = sorted(data.glob("*.json"))
    if len(files) < 2:
        raise SystemExit("leave-one-file-out needs at least two files")
    with tempfile.TemporaryDirectory() as tmp:
        backends = EmbeddedBackends(Path(tmp), Ports.free()).start()
        try:
            convs = asyncio.run(index_and_search(files, [variant], SentenceEncoder(int8=settings.embedding_int8), backends.env))
        finally:
            backends.stop()
    rankings = []
    for conv in tqdm(convs, desc="leave one file out", unit="file"):
        model = fit([c for c in convs if c is not conv], variant.name, params)
        for qi, question in enumerate(conv.questions):
            if not question.evidence:
                continue
            found = fused_candidates(conv, qi, variant.name, params)
            ranked = rerank(found.fused, found.dense, found.keyword, found.hits, model)[:top_k]
            rankings.append(
                Ranked(
                    CATEGORIES[question.category],
                    set(question.evidence),
                    [f.score for f in ranked],
                    [found.dia[f.id] for f in ranked],
                )
            )
    return rankings


def kept_evidence(ranked: Ranked, floor: float) -> tuple[float, int]:
    """Share of the question's evidence among the memories the floor keeps, and how many it keeps."""
    kept = [turn for turn, p in zip(ranked.turns, ranked.probabilities, strict=True) if p >= floor]
    return len(ranked.evidence.intersection(kept)) / len(ranked.evidence), len(kept)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="Directory of LoCoMo conversation files (*.json).")
    parser.add_argument("--top-k", type=int, default=Settings().recall_top_k, help="The context's cap (recall_top_k).")
    args = parser.parse_args()
    rankings = held_out_rankings(args.data, args.top_k)
    groups = {"all": rankings} | {c: [r for r in rankings if r.category == c] for c in CATEGORIES.values()}
    groups = {name: group for name, group in groups.items() if group}
    print(f"\nevidence among the memories kept / memories kept, top {args.top_k}, held out (model fitted on the other files)")
    print(f"{'floor':>8}" + "".join(f"{f'{name} ({len(g)})':>22}" for name, g in groups.items()))
    for floor in FLOORS:
        cells = []
        for group in groups.values():
            results = [kept_evidence(r, floor) for r in group]
            cells.append(f"{statistics.fmean(e for e, _ in results):.3f} / {statistics.fmean(n for _, n in results):4.1f}")
        print(f"{floor:>8g}" + "".join(f"{cell:>22}" for cell in cells))


if __name__ == "__main__":
    main()
