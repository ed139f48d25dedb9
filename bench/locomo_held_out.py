"""`bench.locomo` held out: each LoCoMo file measured over HTTP on a service whose tuned parts never
saw it.

    python -m bench.locomo_held_out ../shared/data/locomo --json bench/out/locomo_held_out.json

The shipped defaults were tuned on these same files: the fusion by `bench.recall_tune`, the second
stage by `bench.rerank_fit`, so `bench.locomo` on them is in-sample. Here, for each file, in process:
the fusion grid point (keyword variant, dense weight, rrf k, time weight) best on the other files,
then a second-stage model fitted on the other files with that fusion and the shipped floors. Then a
fresh `memserve up` with those settings (environment variables, the model as a
`recall_rerank_model` file) ingests that file alone and answers its questions through the public
API, as `bench.locomo` does. The knobs nobody tuned on these files (the floors, `recall_top_k`,
the budget's shares) stay as shipped. The folds' rows are pooled into one table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

import httpx

from bench.common import memserve_up
from bench.locomo import Rows, collect, plot, report, summarize
from bench.recall_tune import VARIANTS, best_on, fusion_grid, index_and_search, score_grid, variant_named
from bench.rerank_fit import fit
from serve_app.embedded.launchers import EmbeddedBackends, Ports
from serve_app.encoding.sentence import SentenceEncoder
from serve_app.services.recall import fusion_params
from serve_app.settings import Settings

HELD_OUT = "held out: each file on a service whose fusion and second stage were tuned on the other files"


def fold_settings(files: list[Path], models: Path) -> dict[str, dict[str, str]]:
    """For each file, the settings tuned without it, as `memserve up`'s environment variables."""
    shipped = Settings()
    with tempfile.TemporaryDirectory() as tmp:
        backends = EmbeddedBackends(Path(tmp), Ports.free()).start()
        try:
            encoder = SentenceEncoder(int8=shipped.embedding_int8)
            convs = asyncio.run(index_and_search(files, VARIANTS, encoder, backends.env))
        finally:
            backends.stop()
    table = score_grid(convs, fusion_grid())
    folds = {}
    for conv in convs:
        others = [c for c in convs if c is not conv]
        variant_name, params = best_on(table, [c.name for c in others])
        variant = variant_named(variant_name)
        tuned = {
            "recall_keyword_context_turns": variant.context_turns,
            "recall_keyword_self_weight": variant.self_weight,
            "recall_dense_weight": params.dense_weight,
            "recall_rrf_k": params.rrf_k,
            "recall_time_weight": params.time_weight,
        }
        # The second stage is fitted on what the service with these settings keeps: its floors on.
        model = fit(others, variant_name, fusion_params(shipped.model_copy(update=tuned)))
        path = models / f"rerank-without-{Path(conv.name).stem}.json"
        path.write_text(json.dumps(model.to_dict(), indent=2))
        folds[conv.name] = {f"MEMSERVE_{k.upper()}": str(v) for k, v in {**tuned, "recall_rerank_model": path}.items()}
    return folds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="Directory of LoCoMo conversation files (*.json).")
    parser.add_argument("--budgets", default="2048,8192", help="max_tokens of the context calls, comma-separated.")
    parser.add_argument("--json", dest="json_out", default="bench/out/locomo_held_out.json")
    args = parser.parse_args()
    files = sorted(args.data.glob("*.json"))
    if len(files) < 2:
        raise SystemExit("leave-one-file-out needs at least two files")
    budgets = [int(b) for b in args.budgets.split(",")]
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    models = out.parent / "held_out_models"
    models.mkdir(exist_ok=True)
    folds = fold_settings(files, models)
    rows = Rows()
    for path in files:
        print(f"\n{path.name}: " + ", ".join(f"{k.removeprefix('MEMSERVE_').lower()}={v}" for k, v in folds[path.name].items()))
        with tempfile.TemporaryDirectory(prefix="memserve-held-out-") as tmp, memserve_up(Path(tmp), folds[path.name]) as url:
            with httpx.Client(base_url=url, timeout=120) as client:
                rows.extend(collect(client, [path], budgets))
    figures = summarize(rows, budgets)
    report(figures, budgets, HELD_OUT)
    out.write_text(json.dumps({"folds": folds, **figures}, indent=2))
    plot(figures, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
