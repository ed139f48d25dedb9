"""Compression policy and extractive summary: pure functions."""

from serve_app.core.compression import (
    SummaryState,
    extract_key_items,
    extractive_summary,
    plan_compaction,
    split_rounds,
)
from serve_app.core.tokenizer import count_tokens


def _turns(n_rounds: int, tool_every: int = 0) -> list[dict]:
    turns, seq = [], 0
    for r in range(n_rounds):
        seq += 1
        turns.append(
            {"seq": seq, "role": "user", "content": f"Question {r} about order ORD-{1000 + r} on 2024-05-{r % 28 + 1:02d}."}
        )
        if tool_every and r % tool_every == 0:
            seq += 1
            turns.append(
                {
                    "seq": seq,
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": "lookup", "arguments": f'{{"id": "ORD-{1000 + r}"}}'}}],
                }
            )
            seq += 1
            turns.append({"seq": seq, "role": "tool", "content": f"amount $ {r}.50"})
        seq += 1
        turns.append({"seq": seq, "role": "assistant", "content": f"Order ORD-{1000 + r} costs ${r * 3}.25."})
    return turns


def test_key_items_keep_ids_numbers_dates_and_amounts():
    text = "Order ORD-2024-0042 cost $1,234.50 on May 8, 2023 at 10:30 pm; ref tx_9f3a, qty 17, mail a.b@x.io, 12%."
    items = extract_key_items(text)
    for expected in ["ORD-2024-0042", "$1,234.50", "May 8, 2023", "10:30 pm", "tx_9f3a", "17", "a.b@x.io", "12%"]:
        assert expected in items, (expected, items)


def test_rounds_keep_tool_calls_with_results():
    rounds = split_rounds(_turns(4, tool_every=2))
    assert len(rounds) == 4
    assert [m["role"] for m in rounds[0]] == ["user", "assistant", "tool", "assistant"]


def test_plan_respects_trigger_and_keeps_rounds():
    turns = _turns(10, tool_every=3)
    assert plan_compaction(turns, 100, trigger_tokens=1000, keep_rounds=2) is None
    target = plan_compaction(turns, 5000, trigger_tokens=1000, keep_rounds=2)
    kept = [t for t in turns if t["seq"] > target]
    assert len(split_rounds(kept)) == 2
    assert kept[0]["role"] == "user"


def test_plan_never_compacts_the_last_rounds_even_when_forced():
    assert plan_compaction(_turns(2), 10**6, trigger_tokens=10, keep_rounds=2, force=True) is None
    assert plan_compaction(_turns(3), 0, trigger_tokens=10, keep_rounds=2, force=True) is not None


def test_extractive_summary_keeps_every_key_item_under_a_tight_cap():
    span = _turns(40, tool_every=4)
    state, text = extractive_summary(SummaryState(), span, span[-1]["seq"], max_tokens=300, count_tokens=count_tokens)
    for turn in span:
        for item in extract_key_items(turn.get("content") or ""):
            assert item in text, item
    assert len(state.lines) < len(span)  # gist lines were dropped to respect the cap


def test_summary_is_incremental():
    first, second = _turns(6)[:6], _turns(6)[6:]
    state1, _ = extractive_summary(SummaryState(), first, first[-1]["seq"], max_tokens=2000, count_tokens=count_tokens)
    state2, text2 = extractive_summary(state1, second, second[-1]["seq"], max_tokens=2000, count_tokens=count_tokens)
    assert "ORD-1000" in text2 and "ORD-1005" in text2
    assert state2.lines[: len(state1.lines)] == state1.lines
