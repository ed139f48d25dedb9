"""CPU of making turns searchable, in process: the Embedder's `encode_documents` on the turns the
memorizer sends it, grouped for the model by token count (the shipped way, `encoding/batches.py`)
against sentence-transformers' own batches of 32 texts sorted by characters (the earlier way).

    python -m bench.encode_documents                    # BEAM long turns and LoCoMo short turns

Long turns are a BEAM conversation's messages cut into passages as the memorizer cuts them (each
embedded plain); short turns are a LoCoMo file's, each embedded whole and sentence by sentence.
Each call carries `--turns-per-call` turns (the memorizer's `memorizer_batch_size` per session
pass); the two ways run on the same calls, alternating, `--repeats` times; the figure is the median
CPU (all threads of this process) and characters per CPU second. Vectors of the two ways differ
only by the int8 activations' per-pass scaling; their cosine is printed too.

    python -m bench.encode_documents --compare passes   # how passes share the two cores

`--compare passes` sends the same calls to the encoder `--callers` at once (the memorizer's
sessions in flight; Serve's batching, which merges callers into one call, is not in it), two ways,
alternating: one pass at a time on two torch threads (before), and the Embedder's
`PASSES_AT_ONCE` passes at once on one thread each, the passes of a call and of calls at once
sharing the pool. It prints the CPU and the wall time of each, and checks that the two ways'
vectors are the same.

    python -m bench.encode_documents --compare encoders # the Embedder's traced model against the eager one

`--compare encoders` runs the same, the Embedder's passes at once for both, with sentence-transformers'
model and with the traced batch model the Embedder ships (encoding/documents.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm import tqdm

from bench.beam_data import default_data_dir, load_conversation
from bench.locomo_data import turns_of
from serve_app.core.passages import split_passages
from serve_app.encoding.sentence import PassEncoder, SentenceEncoder
from serve_app.settings import Settings


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


Call = tuple[list[str], list[bool]]
"""The texts of one `encode_documents` call and which are embedded plain (passages)."""


def long_calls(beam: Path, conversation: str, messages: int, per_call: int, settings: Settings) -> list[Call]:
    """(texts, plain) of each call: the turns' passages, as the memorizer sends them."""
    turns = [m.content for m in load_conversation(beam / conversation).messages[:messages]]
    calls = []
    for start in range(0, len(turns), per_call):
        texts, plain = [], []
        for turn in turns[start : start + per_call]:
            pieces = split_passages(turn, target=settings.memory_passage_chars, whole=settings.memory_whole_chars)
            texts += pieces
            plain += [len(pieces) > 1] * len(pieces)
        calls.append((texts, plain))
    return calls


def short_calls(locomo: Path, turns: int, per_call: int) -> list[Call]:
    texts = [t.content for t in turns_of(json.loads(locomo.read_text()))][:turns]
    return [(texts[i : i + per_call], [False] * len(texts[i : i + per_call])) for i in range(0, len(texts), per_call)]


def fixed_batches(encoder: SentenceEncoder) -> Callable[[list[str]], np.ndarray]:
    def eager(texts: list[str]) -> np.ndarray:
        return encoder.model.encode(texts, normalize_embeddings=True, convert_to_numpy=True, batch_size=32)

    return eager


def run(encoder: SentenceEncoder, calls: list[Call], repeats: int, label: str) -> dict:
    shipped = encoder._vectors
    earlier = fixed_batches(encoder)
    seconds: dict[str, list[float]] = {"shipped": [], "fixed 32": []}
    vectors: dict[str, list] = {}
    for r in tqdm(range(repeats), desc=label, unit="repeat"):
        ways = [("shipped", shipped), ("fixed 32", earlier)]
        for name, eager in ways if r % 2 == 0 else ways[::-1]:
            encoder._vectors = eager  # type: ignore[method-assign]
            started = cpu_seconds()
            out = [encoder.encode_documents(texts, plain) for texts, plain in calls]
            seconds[name].append(cpu_seconds() - started)
            vectors[name] = [v for call in out for v in call]
    encoder._vectors = shipped  # type: ignore[method-assign]
    chars = sum(len(t) for texts, _ in calls for t in texts)
    cosine = np.sum(np.array(vectors["shipped"]) * np.array(vectors["fixed 32"]), axis=1)
    result = {
        "texts": sum(len(texts) for texts, _ in calls),
        "chars": chars,
        "cpu_s": {name: round(statistics.median(v), 2) for name, v in seconds.items()},
        "chars_per_cpu_s": {name: round(chars / statistics.median(v)) for name, v in seconds.items()},
        "cpu_ratio_shipped_to_fixed": round(statistics.median(seconds["shipped"]) / statistics.median(seconds["fixed 32"]), 3),
        "cosine_p5_p50": [round(float(x), 4) for x in np.percentile(cosine, [5, 50])],
    }
    print(label, json.dumps(result))
    return result


Ways = dict[str, tuple[PassEncoder, int]]
"""Each way of running passes: its encoder and the torch threads a pass takes."""


def encoder_ways(settings: Settings) -> Ways:
    """The Embedder's encoders, the same passes at once on one thread each: sentence-transformers'
    model, and the traced batch model it runs without transformers (encoding/documents.py)."""
    from serve_app.deployments.embedder import PASSES_AT_ONCE
    from serve_app.encoding.documents import DocumentEncoder, load_document_encoder

    traced = load_document_encoder(settings.embedding_model, settings.embedding_int8, PASSES_AT_ONCE)
    if not isinstance(traced, DocumentEncoder):
        raise SystemExit("the traced document encoder did not load (see the warning above)")
    eager = SentenceEncoder(int8=settings.embedding_int8, trace_single=False, threads=1, workers=PASSES_AT_ONCE)
    return {"sentence-transformers": (eager, 1), "traced (shipped)": (traced, 1)}


def pass_ways(settings: Settings) -> Ways:
    """One pass at a time on two threads, and the Embedder's passes at once on one thread each."""
    from serve_app.deployments.embedder import PASSES_AT_ONCE

    return {
        "one pass, 2 threads": (SentenceEncoder(int8=settings.embedding_int8, trace_single=False, threads=2), 2),
        f"{PASSES_AT_ONCE} passes, 1 thread each": (
            SentenceEncoder(int8=settings.embedding_int8, trace_single=False, threads=1, workers=PASSES_AT_ONCE),
            1,
        ),
    }


def run_passes(ways: Ways, calls: list[Call], repeats: int, callers: int, label: str) -> dict:
    """CPU and wall time of the calls sent `callers` at a time, each way in turn."""
    import torch

    async def send(encoder: PassEncoder) -> None:
        waiting = asyncio.Semaphore(callers)

        async def one(texts: list[str], plain: list[bool]) -> None:
            async with waiting:
                await encoder.encode_documents_async(texts, plain)

        await asyncio.gather(*(one(texts, plain) for texts, plain in calls))

    figures: dict[str, dict[str, list[float]]] = {name: {"cpu_s": [], "wall_s": []} for name in ways}
    for r in tqdm(range(repeats), desc=label, unit="repeat"):
        for name, (encoder, threads) in list(ways.items()) if r % 2 == 0 else list(ways.items())[::-1]:
            # Each way's own threads take the count in force when they first run torch work.
            torch.set_num_threads(threads)
            cpu, wall = cpu_seconds(), time.perf_counter()
            asyncio.run(send(encoder))
            figures[name]["cpu_s"].append(cpu_seconds() - cpu)
            figures[name]["wall_s"].append(time.perf_counter() - wall)
    first, second = (encoder.encode_documents(*calls[0]) for encoder, _ in ways.values())
    if not np.allclose(np.array(first), np.array(second), atol=1e-6):
        raise SystemExit("the two ways' vectors differ")
    chars = sum(len(t) for texts, _ in calls for t in texts)
    result = {
        name: {
            "cpu_s": round(statistics.median(f["cpu_s"]), 2),
            "wall_s": round(statistics.median(f["wall_s"]), 2),
            "chars_per_cpu_s": round(chars / statistics.median(f["cpu_s"])),
            "chars_per_s": round(chars / statistics.median(f["wall_s"])),
            "runs_cpu_s": [round(x, 2) for x in f["cpu_s"]],
        }
        for name, f in figures.items()
    }
    print(label, json.dumps(result))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beam", type=Path, default=default_data_dir())
    parser.add_argument("--conversation", default="2", help="BEAM conversation whose messages are the long turns")
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--locomo", type=Path, default=default_data_dir().parent / "locomo" / "26.json")
    parser.add_argument("--turns", type=int, default=600, help="LoCoMo turns (short)")
    parser.add_argument("--turns-per-call", type=int, default=Settings().memorizer_batch_size)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--compare", choices=["grouping", "passes", "encoders"], default="grouping")
    parser.add_argument("--callers", type=int, default=8, help="--compare passes: calls in flight at once")
    args = parser.parse_args()
    settings = Settings()
    if args.compare in ("passes", "encoders"):
        long = long_calls(args.beam, args.conversation, args.messages, args.turns_per_call, settings)
        short = short_calls(args.locomo, args.turns, args.turns_per_call)
        ways = pass_ways(settings) if args.compare == "passes" else encoder_ways(settings)
        results = {
            "long turns (BEAM, passages)": run_passes(ways, long, args.repeats, args.callers, "long"),
            "short turns (LoCoMo)": run_passes(ways, short, args.repeats, args.callers, "short"),
        }
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
        return
    encoder = SentenceEncoder(int8=settings.embedding_int8, trace_single=False)
    results = {
        "long turns (BEAM, passages)": run(
            encoder, long_calls(args.beam, args.conversation, args.messages, args.turns_per_call, settings), args.repeats, "long"
        ),
        "short turns (LoCoMo)": run(encoder, short_calls(args.locomo, args.turns, args.turns_per_call), args.repeats, "short"),
    }
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
