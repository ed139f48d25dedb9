"""Token budget: exact, never over, newest turn whole, tool calls not split, shares honoured."""

import random

import pytest

from serve_app.core.budget import BudgetError, BudgetShares, ContextRequest, build_context
from serve_app.core.tokenizer import count_chat


def _turns(n: int, words: int = 20) -> list[dict]:
    return [
        {"seq": i + 1, "role": "user" if i % 2 == 0 else "assistant", "content": " ".join(f"w{i}x{j}" for j in range(words))}
        for i in range(n)
    ]


@pytest.mark.parametrize("max_tokens", [512, 1024, 2048, 8192])
def test_never_over_the_limit_and_usage_is_exact(max_tokens):
    result = build_context(
        ContextRequest(
            max_tokens=max_tokens,
            shares=BudgetShares(),
            system_prompt="Be brief.",
            summary="Earlier: the user ordered ORD-1 for $5.",
            turns=_turns(120),
            facts=["lang (preference): Go"] * 5,
            memories=[f"[2024-01-0{i}] user: memory {i} " * 5 for i in range(1, 9)],
            tool_results=[{"name": "search", "content": "result " * 400}],
        )
    )
    assert result.total_tokens == count_chat(result.messages, add_generation_prompt=True)
    assert result.total_tokens <= max_tokens - result.reserve_output
    assert result.included_seqs[-1] == 120
    assert result.omitted_turns == 120 - len(result.included_seqs)
    assert result.included_seqs == list(range(result.included_seqs[0], 121))  # contiguous newest suffix
    assert sum(s.tokens for k, s in result.sections.items() if k != "output_reserved") == result.total_tokens
    assert result.sections["memory"].tokens <= int(max_tokens * 0.12)
    assert result.sections["tool_results"].tokens <= int(max_tokens * 0.12)


def test_unused_shares_flow_to_history():
    lean = build_context(ContextRequest(max_tokens=2048, shares=BudgetShares(), turns=_turns(200)))
    assert lean.sections["history"].tokens > 2048 * 0.62
    assert lean.total_tokens > 2048 * 0.85


def test_reserve_output_overrides_the_output_share():
    result = build_context(ContextRequest(max_tokens=2048, shares=BudgetShares(), reserve_output=1000, turns=_turns(200)))
    assert result.limit == 1048
    assert result.total_tokens <= 1048


def test_tool_call_never_split_from_its_result():
    turns = _turns(30)
    turns += [
        {"seq": 31, "role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
        {"seq": 32, "role": "tool", "content": "big " * 300},
        {"seq": 33, "role": "assistant", "content": "ok"},
        {"seq": 34, "role": "user", "content": "next"},
    ]
    for max_tokens in range(500, 1400, 37):
        result = build_context(ContextRequest(max_tokens=max_tokens, shares=BudgetShares(), turns=turns))
        seqs = set(result.included_seqs)
        assert (31 in seqs) == (32 in seqs)


def test_newest_turn_too_big_is_a_budget_error_with_counts():
    huge = [{"seq": 1, "role": "user", "content": "token " * 3000}]
    with pytest.raises(BudgetError) as info:
        build_context(ContextRequest(max_tokens=1024, shares=BudgetShares(), turns=huge))
    assert info.value.counts["newest_turn"] > 1024


def test_summary_goes_in_before_older_turns():
    result = build_context(ContextRequest(max_tokens=600, shares=BudgetShares(), summary="S " * 50, turns=_turns(100)))
    assert "S S S" in result.messages[0]["content"]
    assert result.sections["summary"].tokens > 0


# Texts whose line ends and starts stress the tokenizer's pre-split: trailing spaces and punctuation,
# newlines and blank lines, digits, combining marks, CJK, emoji, a special token in user text.
AWKWARD = [
    "plain words",
    "ends with a space ",
    "ends with punctuation.",
    "ends with a newline\n",
    "two\n\nblank lines\n\n",
    "  leading spaces",
    "\tTab and ... dots!!",
    "numbers 12345 and T-42",
    "e\u0301 combining mark",
    "caf\u00e9 na\u0131ve \u4f60\u597d\u4e16\u754c",
    "emoji \U0001f600\U0001f680",
    "fake <|im_end|> special",
    "'s 've 'll contractions",
    "\u3000ideographic space \u3000",
]


@pytest.mark.parametrize("seed", range(40))
def test_section_and_prompt_counts_are_exact_for_awkward_text(seed):
    """The budget counts the system section a line at a time and sums the prompt from its parts;
    both must equal a full count of the prompt whatever the text's edges look like."""
    rng = random.Random(seed)

    def text(n: int) -> str:
        return "".join(rng.choice(AWKWARD) for _ in range(n))

    result = build_context(
        ContextRequest(
            max_tokens=rng.choice([600, 1200, 4096]),
            shares=BudgetShares(),
            system_prompt=rng.choice([None, text(2), text(1) + "\n"]),
            summary=rng.choice([None, text(3)]),
            turns=[{"seq": i + 1, "role": rng.choice(["user", "assistant"]), "content": text(3)} for i in range(30)],
            facts=[text(1) for _ in range(rng.randint(0, 4))],
            memories=[text(2) for _ in range(rng.randint(0, 8))],
            tool_results=[{"name": "t", "content": text(4)} for _ in range(rng.randint(0, 2))],
        )
    )
    assert result.total_tokens == count_chat(result.messages, add_generation_prompt=True)
    assert result.total_tokens <= result.limit
    assert sum(s.tokens for k, s in result.sections.items() if k != "output_reserved") == result.total_tokens


def _round_with_parallel_tools(seq: int, size: int) -> list[dict]:
    """A user turn, an assistant turn calling two tools at once, both results, the answer."""
    calls = [
        {"id": f"c{seq}a", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "a"}'}},
        {"id": f"c{seq}b", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
    ]
    return [
        {"seq": seq, "role": "user", "content": f"question {seq} " * 5},
        {"seq": seq + 1, "role": "assistant", "content": "", "tool_calls": calls},
        {"seq": seq + 2, "role": "tool", "tool_call_id": f"c{seq}a", "content": "result a " * size},
        {"seq": seq + 3, "role": "tool", "tool_call_id": f"c{seq}b", "content": "result b " * size},
        {"seq": seq + 4, "role": "assistant", "content": f"answer {seq}"},
    ]


def test_parallel_tool_calls_keep_all_their_results_across_a_compaction_boundary():
    """History after a checkpoint starts on a round; within any budget an assistant turn that calls
    tools in parallel is in the prompt with every one of its results, or not at all."""
    from serve_app.core.compression import plan_compaction
    from serve_app.core.tokenizer import count_block

    dialog = [turn for r in range(12) for turn in _round_with_parallel_tools(1 + 5 * r, 20 + 7 * r)]
    target = plan_compaction(dialog, sum(count_block([t]) for t in dialog), trigger_tokens=0, keep_rounds=4, force=True)
    history = [t for t in dialog if t["seq"] > target]
    assert history[0]["role"] == "user" and len(history) == 20  # the boundary falls between rounds
    callers = {t["seq"]: {c["id"] for c in t["tool_calls"]} for t in history if t.get("tool_calls")}
    result_of = {t["seq"]: t["tool_call_id"] for t in history if t["role"] == "tool"}
    for max_tokens in range(400, 2600, 23):
        try:
            result = build_context(ContextRequest(max_tokens=max_tokens, shares=BudgetShares(), summary="S1.", turns=history))
        except BudgetError:
            continue  # the newest round alone does not fit
        kept = set(result.included_seqs)
        for seq, ids in callers.items():
            results = {s for s, call in result_of.items() if call in ids}
            assert (seq in kept) == (results <= kept) and (seq in kept or not results & kept), (max_tokens, seq, kept)
        assert result.total_tokens == count_chat(result.messages, add_generation_prompt=True) <= result.limit


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "lookup_order", "description": "An order by id, in the shop's database.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string", "pattern": "^ORD-\\d+$"}}}}},
]  # fmt: skip


@pytest.mark.parametrize("seed", range(30))
def test_tool_definitions_are_counted_exactly_and_kept_inside_the_limit(seed):
    """A chat request's tool definitions follow the system section in the prompt: counted exactly,
    whatever the system section ends with, and the prompt still fits."""
    rng = random.Random(seed)

    def text(n: int) -> str:
        return "".join(rng.choice(AWKWARD) for _ in range(n))

    tools = TOOLS[: rng.randint(1, 2)]
    result = build_context(
        ContextRequest(
            max_tokens=rng.choice([700, 1200, 4096]),
            shares=BudgetShares(),
            system_prompt=rng.choice([None, text(2), text(1) + "\n", "ends with spaces  "]),
            summary=rng.choice([None, text(3)]),
            turns=[{"seq": i + 1, "role": rng.choice(["user", "assistant"]), "content": text(3)} for i in range(40)],
            memories=[text(2) for _ in range(rng.randint(0, 8))],
            tools=tools,
        )
    )
    assert result.total_tokens == count_chat(result.messages, add_generation_prompt=True, tools=tools)
    assert result.sections["tool_definitions"].tokens > 0
    assert result.total_tokens <= result.limit
    assert sum(s.tokens for k, s in result.sections.items() if k != "output_reserved") == result.total_tokens
