"""Texts grouped for the embedding model by token count (serve_app/encoding/batches.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from serve_app.encoding.batches import token_batches


@given(
    st.lists(st.integers(min_value=1, max_value=300), max_size=80),
    st.integers(min_value=1, max_value=5000),
    st.integers(min_value=1, max_value=40),
)
def test_every_text_goes_once_longest_first_within_the_budget(lengths: list[int], budget: int, most: int):
    groups = token_batches(lengths, budget, most)
    flat = [i for group in groups for i in group]
    assert sorted(flat) == list(range(len(lengths)))
    assert [lengths[i] for i in flat] == sorted(lengths, reverse=True)
    for group in groups:
        assert group and len(group) <= most and (len(group) == 1 or len(group) * lengths[group[0]] <= budget)
        assert lengths[group[0]] == max(lengths[i] for i in group)
    # Greedy: a group stops only where the next text would not fit (or the texts run out).
    for group in groups[:-1]:
        assert len(group) == most or (len(group) + 1) * lengths[group[0]] > budget


def test_short_texts_share_a_pass_and_long_ones_split():
    lengths = [12] * 100 + [256] * 20
    groups = token_batches(lengths, 4096, 100)
    # 16 of the window's length a pass; the last long texts pad the first short ones; then the rest at once.
    assert [len(g) for g in groups] == [16, 16, 88]
    assert [len(g) for g in token_batches(lengths, 4096, 32)] == [16, 16, 32, 32, 24]
    assert groups[0] == list(range(100, 116)) and groups[1] == list(range(116, 120)) + list(range(12))


def test_a_text_past_the_budget_goes_alone():
    assert token_batches([5000, 3, 3], 4096, 32) == [[0], [1, 2]]
    assert token_batches([], 4096, 32) == []
