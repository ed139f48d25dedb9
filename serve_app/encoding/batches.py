"""How texts go through the embedding model together. Pure: no torch.

A forward pass costs what its padded tensor holds: its texts times its longest text's tokens. A
fixed count of texts per pass, grouped by characters as sentence-transformers groups them, pads
prose next to code (far more tokens per character) and makes long passes whose activations
outgrow the CPU's caches. Grouping by token count, longest first, with a budget of padded tokens
per pass makes each pass hold texts of about one length, and as many as before (32) where they
are short (docs/benchmarks/encode_documents.md).
"""

from __future__ import annotations

from collections.abc import Sequence

BATCH_TOKENS = 4096
"""Padded tokens per forward pass: 16 texts of the model's 256-token window."""
BATCH_TEXTS = 32
"""Texts per forward pass at most, however short: sentence-transformers' own batch size."""


def token_batches(lengths: Sequence[int], budget: int = BATCH_TOKENS, most: int = BATCH_TEXTS) -> list[list[int]]:
    """The texts' indices in groups for one pass each: longest first (ties in input order), each
    group as many texts as fit `budget` padded tokens (its first text is its longest), a text
    longer than the budget alone."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    start = 0
    while start < len(order):
        count = max(1, min(most, budget // max(1, lengths[order[start]])))
        groups.append(order[start : start + count])
        start += count
    return groups
