"""The summary memories a compaction leaves: blocks by seq, so a retried or later compaction writes
the same block again rather than another one."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from serve_app.core.session_summaries import summary_blocks


def _turns(first: int, last: int) -> list[dict]:
    return [
        {"seq": s, "role": "user" if s % 2 else "assistant", "content": f"Turn {s} is about topic {s}. More words follow.",
         "created_at": f"2024-03-{s:02d}T10:00:00+00:00"}
        for s in range(first, last + 1)
    ]  # fmt: skip


def test_blocks_follow_the_seqs_and_carry_each_turns_first_sentence_and_its_last_date():
    blocks = summary_blocks(_turns(1, 11), size=4)
    assert [(b.index, b.first_seq, b.last_seq) for b in blocks] == [(0, 1, 4), (1, 5, 8), (2, 9, 11)]
    assert blocks[1].text == (
        "Summary of turns 5-8 of a session:"
        "\n  user: Turn 5 is about topic 5."
        "\n  assistant: Turn 6 is about topic 6."
        "\n  user: Turn 7 is about topic 7."
        "\n  assistant: Turn 8 is about topic 8."
    )
    assert blocks[2].created_at == "2024-03-11T10:00:00+00:00"


def test_system_turns_and_empty_turns_are_left_out():
    turns = _turns(1, 3)
    turns[0] |= {"role": "system"}
    turns[1] |= {"content": "   "}
    (block,) = summary_blocks(turns, size=8)
    assert (block.first_seq, block.last_seq) == (3, 3) and block.text.startswith("Summary of turn 3 of")


@given(st.integers(1, 40), st.lists(st.integers(1, 40), max_size=4), st.integers(1, 9))
def test_folding_a_session_in_any_spans_ends_with_the_blocks_of_folding_it_at_once(last, cuts, size):
    """However compactions split the turns (each span's first block completed from the log, as the
    memorizer does), the last write of each block is the block of all its turns."""
    written: dict[int, str] = {}
    bounds = sorted({c for c in cuts if c < last} | {last})
    start = 1
    for end in bounds:
        block_first = ((start - 1) // size) * size + 1
        for block in summary_blocks(_turns(block_first, end), size):
            written[block.index] = block.text
        start = end + 1
    assert written == {b.index: b.text for b in summary_blocks(_turns(1, last), size)}
