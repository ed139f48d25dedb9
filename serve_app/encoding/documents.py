"""Memories' vectors for the Embedder without transformers in its process.

The Embedder encodes padded batches. Through sentence-transformers that process imports
transformers, scikit-learn, scipy and PIL for one forward pass a batch (docs/benchmarks/memory.md).
`encoding/query.py` builds, once per machine and model, a TorchScript trace of the same transformer
made on a padded pass (`batch.pt`), with the eager model's vectors for one padded pass over the
probe texts; here it is loaded with `torch.jit.load`, batches are tokenized with the model's own
`tokenizer.json` and padded with its pad token, mean-pooled over the mask and normalized, and the
artifact is refused unless it reproduces the probe pass. Grouping, the pool of passes and the
vectors memories are stored under are `PassEncoder`'s, the same code as the eager encoder's.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from serve_app.encoding.batches import BATCH_TEXTS, BATCH_TOKENS
from serve_app.encoding.query import ensure_artifact, mean_pooled
from serve_app.encoding.sentence import TRACE_TOLERANCE, PassEncoder, SentenceEncoder, bundled_model_path

logger = logging.getLogger("ray.serve")


def _pad_token(model_path: Path) -> str:
    try:
        return json.loads((model_path / "tokenizer_config.json").read_text()).get("pad_token") or "[PAD]"
    except (OSError, ValueError):
        return "[PAD]"


class DocumentEncoder(PassEncoder):
    """The traced transformer for padded passes: torch and tokenizers, nothing else."""

    def __init__(
        self,
        artifact: Path,
        model_path: str,
        batch_tokens: int = BATCH_TOKENS,
        batch_texts: int = BATCH_TEXTS,
        workers: int = 1,
    ):
        import tokenizers
        import torch

        torch.set_num_threads(1)  # one thread a pass, `workers` passes at once (PassEncoder)
        super().__init__(batch_tokens, batch_texts, workers)
        meta = json.loads((artifact / "meta.json").read_text())
        self.model = torch.jit.load(str(artifact / "batch.pt")).eval()
        self.inputs: list[str] = meta["inputs"]
        self.tokenizer = tokenizers.Tokenizer.from_file(str(Path(model_path) / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=meta["max_seq_length"])
        pad = _pad_token(Path(model_path))
        pad_id = self.tokenizer.token_to_id(pad)
        if pad_id is None:
            raise ValueError(f"the tokenizer has no pad token {pad!r}")
        self.tokenizer.enable_padding(pad_id=pad_id, pad_token=pad)  # to the longest text of the pass
        texts = [probe["text"] for probe in meta["probes"]]
        got = self._pass(texts)
        import numpy as np

        worst = float(np.abs(got - np.array(meta["batch_probe_vectors"], dtype=np.float32)).max())
        if worst > TRACE_TOLERANCE:
            raise ValueError(f"traced document encoder differs from the eager model by {worst:.2e} on the probe pass")

    def _encodings(self, texts: list[str]) -> list[Any]:
        with self._tokenizing:  # sentence-transformers strips its inputs too
            return self.tokenizer.encode_batch([text.strip() for text in texts])

    def _token_counts(self, texts: list[str]) -> list[int]:
        return [sum(encoding.attention_mask) for encoding in self._encodings(texts)]

    def _pass(self, texts: list[str]):
        import torch

        encodings = self._encodings(texts)
        columns = {
            "input_ids": [e.ids for e in encodings],
            "attention_mask": [e.attention_mask for e in encodings],
            "token_type_ids": [e.type_ids for e in encodings],
        }
        with torch.inference_mode():
            out = self.model(**{name: torch.tensor(columns[name]) for name in self.inputs})
            return mean_pooled(out, columns["attention_mask"]).float().numpy()


def load_document_encoder(model_path: str = "", int8: bool = False, workers: int = 1) -> DocumentEncoder | SentenceEncoder:
    """The traced document encoder, built first if this machine has none for the model; else the
    eager `SentenceEncoder` (which imports transformers)."""
    model_path = model_path or bundled_model_path()
    try:
        return DocumentEncoder(ensure_artifact(model_path, int8), model_path, workers=workers)
    except Exception as exc:
        logger.warning("traced document encoder unavailable (%s): embedding memories with sentence-transformers", exc)
        return SentenceEncoder(model_path, threads=1, int8=int8, trace_single=False, workers=workers)
