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
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm import tqdm

from bench.beam_data import default_data_dir, load_conversation
from bench.locomo_data import turns_of
from serve_app.core.passages import split_passages
from serve_app.encoding.sentence import SentenceEncoder
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
    shipped = encoder._eager
    earlier = fixed_batches(encoder)
    seconds: dict[str, list[float]] = {"shipped": [], "fixed 32": []}
    vectors: dict[str, list] = {}
    for r in tqdm(range(repeats), desc=label, unit="repeat"):
        ways = [("shipped", shipped), ("fixed 32", earlier)]
        for name, eager in ways if r % 2 == 0 else ways[::-1]:
            encoder._eager = eager  # type: ignore[method-assign]
            started = cpu_seconds()
            out = [encoder.encode_documents(texts, plain) for texts, plain in calls]
            seconds[name].append(cpu_seconds() - started)
            vectors[name] = [v for call in out for v in call]
    encoder._eager = shipped  # type: ignore[method-assign]
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
    args = parser.parse_args()
    settings = Settings()
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
