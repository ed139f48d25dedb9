"""The sentence embedding model: `DocumentEncoder` (a traced copy for padded batches of documents, in
the Embedder), `QueryEncoder` (a traced copy for one query at a time, in the ingress) and
`SentenceEncoder` (sentence-transformers itself, which builds both and serves where they cannot).

Services see either only through these call shapes, so they never import torch.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

DOCUMENT_EMBEDDING = 2
"""Bumped whenever `PassEncoder.encode_documents` changes what it returns: memories embedded
with an older one are embedded again by the memorizer (`services/index_repair.reembed_vectors`).
1: the whole text; 2: the whole text plus the mean of its sentences."""

Vector = list[float]
EmbedOne = Callable[[str], Awaitable[Vector]]


class EmbedMany(Protocol):
    """Memories' vectors, in order. `plain[i]` true: text i is a passage of a long turn, embedded
    whole only (it is short enough for one vector; the sentences' mean would double its cost)."""

    def __call__(self, texts: list[str], plain: Sequence[bool] | None = None, /) -> Awaitable[list[Vector]]: ...
