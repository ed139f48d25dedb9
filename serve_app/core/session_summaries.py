"""The long-term memories a session's summary checkpoint leaves behind. Pure: no I/O.

A question about the whole history ("summarize my progress", "in what order did I ...") is answered
badly from the three turns that match it best: it needs what every session was about. Each time a
compaction folds turns into the checkpoint, those turns are remembered as summary memories: the
extractive summary's line of each turn (its first sentence, core/compression.py), grouped in blocks
of a fixed number of the session's turns, dated at the block's last turn, recalled like any memory.

Blocks follow the turns' seqs (turns 1-8, 9-16, ...), not the compaction's span, so the same turns
always give the same block id: a compaction retried after a crash or a lost compare-and-set writes
the same rows again, and a block a later compaction finishes is rewritten whole under its id.
The lines are extractive even when an LLM writes the checkpoint: they keep the turns' own words
(numbers, ids, names), cost no model call, and never restate an earlier block as a rolling summary
does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from serve_app.core.compression import gist

SUMMARY_KIND = "summary"
"""Role and kind of a summary memory."""


@dataclass(frozen=True)
class SummaryBlock:
    index: int
    """The block's place in its session, from 0: turns index*size+1 .. (index+1)*size."""
    first_seq: int
    last_seq: int
    created_at: str | None
    """The block's last turn's time: the date the memory carries."""
    text: str


def block_of(seq: int, size: int) -> int:
    return (seq - 1) // size


def block_start(index: int, size: int) -> int:
    """The first seq of block `index`."""
    return index * size + 1


def summary_blocks(turns: Sequence[dict[str, Any]], size: int) -> list[SummaryBlock]:
    """The summary memories of `turns` (a session's compacted turns, in seq order), one per block
    of `size` seqs they touch; system turns and turns with nothing to say are left out."""
    grouped: dict[int, list[dict[str, Any]]] = {}
    for turn in turns:
        if turn.get("role") == "system" or not gist(turn):
            continue
        grouped.setdefault(block_of(int(turn["seq"]), size), []).append(turn)
    blocks = []
    for index, members in grouped.items():
        first, last = int(members[0]["seq"]), int(members[-1]["seq"])
        span = f"turn {first}" if first == last else f"turns {first}-{last}"
        lines = "".join(f"\n  {turn.get('role')}: {gist(turn)}" for turn in members)
        blocks.append(SummaryBlock(index, first, last, members[-1].get("created_at"), f"Summary of {span} of a session:{lines}"))
    return blocks
