"""The sentence embedding model: `SentenceEncoder` (sentence-transformers, batches of documents, in
the Embedder) and `QueryEncoder` (a traced copy for one query at a time, in the ingress).

Services see either only through these call shapes, so they never import torch.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

Vector = list[float]
EmbedOne = Callable[[str], Awaitable[Vector]]
EmbedMany = Callable[[list[str]], Awaitable[list[Vector]]]
