"""Query embedding for the ingress without transformers in its process.

The ingress embeds each recall query itself (no Serve hop on the recall path). Doing that through
sentence-transformers imports transformers too, a large share of an ingress replica's resident
memory (docs/benchmarks/memory.md) for one forward pass per query. Here a subprocess builds, once per
machine and model, a TorchScript trace of the same transformer (`SentenceEncoder.traced`) with the
eager model's vectors for probe texts; the ingress loads it with `torch.jit.load`, tokenizes with
the model's own `tokenizer.json` (the `tokenizers` library sentence-transformers uses), mean-pools
and normalizes, and refuses the artifact unless it reproduces every probe vector. Anything
unexpected (another pooling, no `tokenizer.json`, a failed build) falls back to the in-process
`SentenceEncoder`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

from serve_app.encoding.sentence import TRACE_PROBES, TRACE_TOLERANCE, SentenceEncoder, bundled_model_path
from serve_app.runtime.cache import cache_base

logger = logging.getLogger("ray.serve")

ARTIFACT_FORMAT = 2  # bump when what `build` writes changes
BUILD_TIMEOUT_S = 600


def cache_root() -> Path:
    """Where the traced builds are kept (a build is machine-specific)."""
    return cache_base() / "query-encoder"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"


def artifact_dir(model_path: str, int8: bool) -> Path:
    """One directory per model, quantization and library versions: an upgrade builds afresh."""
    key = {
        "format": ARTIFACT_FORMAT,
        "model": str(Path(model_path).resolve()),
        "int8": int8,
        "versions": [_version(p) for p in ("torch", "transformers", "sentence-transformers", "tokenizers")],
        "probes": TRACE_PROBES,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / digest


def build(model_path: str, int8: bool, out: Path) -> None:
    """Trace the model and write `model.pt` and `meta.json` into `out` (atomically: concurrent
    builders each write a directory of their own and the first rename wins)."""
    import torch

    encoder = SentenceEncoder(model_path, threads=1, int8=int8)
    modules = list(encoder.model)
    names = [type(m).__name__ for m in modules]
    if encoder.traced is None:
        raise RuntimeError("the model could not be traced to the eager model's vectors")
    if names != ["Transformer", "Pooling", "Normalize"] or getattr(modules[1], "pooling_mode", None) != "mean":
        raise RuntimeError(f"only Transformer -> mean Pooling -> Normalize is rebuilt outside sentence-transformers, not {names}")
    if getattr(modules[0], "do_lower_case", False):
        raise RuntimeError("do_lower_case models are not rebuilt outside sentence-transformers")
    if encoder._prompt or encoder._dims:
        raise RuntimeError("models with a default prompt or a truncated dimension are not rebuilt outside sentence-transformers")
    inputs = sorted(k for k, v in encoder._features(TRACE_PROBES[1]).items() if isinstance(v, torch.Tensor))
    meta = {
        "max_seq_length": encoder.model.max_seq_length,
        "inputs": inputs,
        "probes": [{"text": t, "vector": encoder._vectors([t])[0].tolist()} for t in TRACE_PROBES],
        # One pass over every probe, padded: the batch trace must give what the eager model gives
        # for the same pass (with int8 layers a text's vector depends a little on its pass).
        "batch_probe_vectors": encoder._pass(list(TRACE_PROBES)).tolist(),
    }
    staging = out.parent / f".{out.name}.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    torch.jit.save(encoder.traced, str(staging / "model.pt"))
    # For batches: the one-text trace runs without a mask.
    torch.jit.save(encoder.trace_transformer(list(TRACE_PROBES[:3])), str(staging / "batch.pt"))
    (staging / "meta.json").write_text(json.dumps(meta))
    try:
        staging.rename(out)
    except OSError:  # another builder finished first
        shutil.rmtree(staging, ignore_errors=True)


def mean_pooled(out, attention_mask: list[list[int]]):
    """The traced transformer's output mean-pooled over each text's tokens and normalized, as the
    eager model's Pooling and Normalize modules do: one row a text."""
    import torch

    tokens = out["last_hidden_state"] if isinstance(out, dict) else out[0]
    mask = torch.tensor(attention_mask, dtype=tokens.dtype).unsqueeze(-1)
    pooled = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, p=2, dim=1)


class QueryEncoder:
    """A traced sentence model for one text at a time: torch and tokenizers, nothing else."""

    def __init__(self, artifact: Path, model_path: str, threads: int = 1):
        import tokenizers
        import torch

        torch.set_num_threads(max(1, threads))
        meta = json.loads((artifact / "meta.json").read_text())
        self.model = torch.jit.load(str(artifact / "model.pt")).eval()
        self.inputs: list[str] = meta["inputs"]
        self.tokenizer = tokenizers.Tokenizer.from_file(str(Path(model_path) / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=meta["max_seq_length"])
        for probe in meta["probes"]:
            got = self.encode([probe["text"]])[0]
            worst = max(abs(a - b) for a, b in zip(got, probe["vector"], strict=True))
            if worst > TRACE_TOLERANCE:
                raise ValueError(f"traced query encoder differs from the eager model by {worst:.2e} on {probe['text'][:40]!r}")
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="query-encoder")

    def encode(self, texts: list[str]) -> list[list[float]]:
        import torch

        vectors = []
        with torch.inference_mode():
            for text in texts:
                encoding = self.tokenizer.encode(text.strip())  # sentence-transformers strips its inputs too
                columns = {
                    "input_ids": encoding.ids,
                    "attention_mask": encoding.attention_mask,
                    "token_type_ids": encoding.type_ids,
                }
                out = self.model(**{name: torch.tensor([columns[name]]) for name in self.inputs})
                vectors.append(mean_pooled(out, [encoding.attention_mask])[0].tolist())
        return vectors

    async def encode_one(self, text: str) -> list[float]:
        """Off the event loop: torch releases the GIL while the traced graph runs."""
        return (await asyncio.get_running_loop().run_in_executor(self.executor, self.encode, [text]))[0]


def ensure_artifact(model_path: str, int8: bool) -> Path:
    """This machine's traced build of the model (`build`, in a subprocess), made first if there is none."""
    out = artifact_dir(model_path, int8)
    if not (out / "meta.json").exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", __name__, "--model", model_path, "--out", str(out)]
        command += ["--int8"] if int8 else []
        done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}")
    return out


def load_query_encoder(model_path: str = "", int8: bool = False) -> QueryEncoder | SentenceEncoder:
    """The traced encoder, built first if this machine has none for the model; else the
    in-process `SentenceEncoder` (which imports transformers)."""
    model_path = model_path or bundled_model_path()
    try:
        return QueryEncoder(ensure_artifact(model_path, int8), model_path)
    except Exception as exc:
        logger.warning("traced query encoder unavailable (%s): embedding queries with sentence-transformers", exc)
        return SentenceEncoder(model_path, threads=1, int8=int8)


def main() -> None:
    parser = argparse.ArgumentParser(description="Build the traced query encoder (run by load_query_encoder).")
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--int8", action="store_true")
    args = parser.parse_args()
    build(args.model, args.int8, args.out)


if __name__ == "__main__":
    main()
