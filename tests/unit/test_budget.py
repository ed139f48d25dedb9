"""Token budget: exact, never over, newest turn whole, tool calls not split, every section its share
when all compete, and what a section leaves flows to memory, then history."""

import random
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from pydantic import ValidationError

from serve_app.core.budget import STANDING_HEADER, BudgetError, BudgetShares, ContextRequest, build_context
from serve_app.core.memory_lines import MemoryItem
from serve_app.core.tokenizer import count_block, count_chat, count_tokens


def _memories(n: int, words: int = 12, sessions: int = 3) -> list[MemoryItem]:
    """`n` distinct memories, best first, spread over a few sessions and days."""
    return [
        MemoryItem(
            text=f"user: memory {i} " + " ".join(f"m{i}y{j}" for j in range(words)),
            day=f"2024-01-{1 + i % sessions:02d}",
            session=f"s{i % sessions}",
            seq=10 * i,
        )
        for i in range(n)
    ]


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
            memories=_memories(8),
            tool_results=[{"name": "search", "content": "result " * 400}],
        )
    )
    assert result.total_tokens == count_chat(result.messages, add_generation_prompt=True)
    assert result.total_tokens <= max_tokens - result.reserve_output
    assert result.included_seqs[-1] == 120
    assert result.omitted_turns == 120 - len(result.included_seqs)
    assert result.included_seqs == list(range(result.included_seqs[0], 121))  # contiguous newest suffix
    assert sum(s.tokens for k, s in result.sections.items() if k != "output_reserved") == result.total_tokens
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
            memories=[MemoryItem(text(2), f"2024-0{1 + i % 3}-01", f"s{i % 2}", i) for i in range(rng.randint(0, 8))],
            tool_results=[{"name": "t", "content": text(4)} for _ in range(rng.randint(0, 2))],
        )
    )
    assert result.total_tokens == count_chat(result.messages, add_generation_prompt=True)
    assert result.total_tokens <= result.limit
    assert sum(s.tokens for k, s in result.sections.items() if k != "output_reserved") == result.total_tokens


@pytest.mark.parametrize("seed", range(40))
def test_appended_lines_count_as_the_whole_section_does(seed):
    """A grown section is counted line by line (each line through the count cache); the sum must be
    the difference of two full counts whatever the lines start and end with."""
    from serve_app.core.budget import _appended_tokens, _system_tokens

    rng = random.Random(seed)

    def text(n: int) -> str:
        return "".join(rng.choice([*AWKWARD, "\n", "\n- ", "\n  ", "\n[2024-01-01]"]) for _ in range(n))

    content, extra = text(rng.randint(0, 6)), text(rng.randint(1, 12))
    assert _appended_tokens(content, extra) == _system_tokens(content + extra) - _system_tokens(content)


@pytest.mark.parametrize("seed", range(40))
def test_lines_cut_exactly_where_a_line_starts_with_a_non_space_character(seed):
    from serve_app.core.budget import _lines

    rng = random.Random(seed)
    parts = [*AWKWARD, "\n", "\n\n", "\n- ", "\n  ", "\n\t", "\n\u3000", "x"]
    text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 12)))
    pieces = _lines(text)
    assert "".join(pieces) == text
    assert all(piece.endswith("\n") for piece in pieces[:-1])
    assert all(piece and not piece[0].isspace() for piece in pieces[1:])
    # no cut left inside a piece: a newline within one is followed by a space or ends it
    assert all(piece[i + 1].isspace() for piece in pieces for i in range(len(piece) - 1) if piece[i] == "\n")


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
            memories=[MemoryItem(text(2), "2024-01-01", "s", i) for i in range(rng.randint(0, 8))],
            tools=tools,
        )
    )
    assert result.total_tokens == count_chat(result.messages, add_generation_prompt=True, tools=tools)
    assert result.sections["tool_definitions"].tokens > 0
    assert result.total_tokens <= result.limit
    assert sum(s.tokens for k, s in result.sections.items() if k != "output_reserved") == result.total_tokens


def test_shares_have_no_system_share():
    """The system prompt always goes in whole; a share for it would promise nothing."""
    with pytest.raises(ValidationError, match="shares.system is not a share"):
        BudgetShares.model_validate({"system": 0.1, "memory": 0.2})
    with pytest.raises(ValidationError, match="more than 1"):
        BudgetShares(memory=0.5, history=0.5, tools=0.1)


def _competing(max_tokens: int, seed: int = 0) -> ContextRequest:
    """Every section with more than its share to give."""
    return ContextRequest(
        max_tokens=max_tokens,
        shares=BudgetShares(),
        system_prompt="Be brief.",
        summary="Earlier: " + " ".join(f"s{i}" for i in range(max_tokens // 8)),
        turns=_turns(max_tokens // 10, words=15 + seed % 5),
        facts=["lang (preference): Go", "city (fact): Oslo"],
        memories=_memories(max_tokens // 10),
        tool_results=[{"name": "search", "content": "result " * max_tokens}],
    )


@pytest.mark.parametrize("max_tokens", [1024, 2048, 4096, 8192, 32768])
def test_every_section_gets_its_share_when_all_compete(max_tokens):
    result = build_context(_competing(max_tokens))
    shares, sections = BudgetShares(), result.sections
    block = max(count_block([t]) for t in _competing(max_tokens).turns)
    line = 40  # the largest memory line with its group header, in tokens
    assert sections["memory"].tokens >= int(max_tokens * shares.memory) - line
    assert sections["tool_results"].tokens >= int(max_tokens * shares.tools) - 8
    assert sections["summary"].tokens + sections["history"].tokens >= int(max_tokens * shares.history) - block
    assert result.total_tokens <= result.limit
    assert sections["memory"].reason == sections["tool_results"].reason == sections["history"].reason == "room"


def test_memory_takes_the_room_history_and_tools_leave():
    """A fresh session (one turn) and many relevant memories: memory fills what the others leave."""
    result = build_context(ContextRequest(max_tokens=2048, shares=BudgetShares(), turns=_turns(1), memories=_memories(200)))
    memory = result.sections["memory"]
    assert memory.tokens > 2048 * 0.12 * 5
    mandatory = sum(result.sections[k].tokens for k in ("system", "template", "history"))  # history: the newest turn
    assert memory.budget == result.limit - mandatory
    assert memory.tokens > memory.budget - 40  # full, but for less than a line
    assert memory.reason == "room" and memory.share == int(2048 * 0.12) and memory.budget > memory.share
    assert len(result.memories_used) > 20


def test_memory_stops_at_what_it_was_given():
    """Five memories passed the floors: five go in, and history takes everything else."""
    result = build_context(ContextRequest(max_tokens=4096, shares=BudgetShares(), turns=_turns(400), memories=_memories(5)))
    assert result.memories_used == [0, 1, 2, 3, 4]
    assert result.sections["memory"].reason == "all_fit"
    assert result.total_tokens > result.limit - max(count_block([t]) for t in _turns(400))  # history filled the rest


def test_history_keeps_its_share_against_memory():
    """Memory's spill never takes the recent turns' share."""
    for max_tokens in (1024, 2048, 8192):
        result = build_context(
            ContextRequest(max_tokens=max_tokens, shares=BudgetShares(), turns=_turns(500), memories=_memories(500))
        )
        block = max(count_block([t]) for t in _turns(500))
        assert result.sections["history"].tokens >= int(max_tokens * 0.62) - block
        assert result.sections["memory"].tokens > int(max_tokens * 0.12)  # it took the rest


def test_tool_results_keep_to_their_share_and_leave_the_rest():
    small = build_context(
        ContextRequest(
            max_tokens=4096,
            shares=BudgetShares(),
            turns=_turns(1),
            memories=_memories(300),
            tool_results=[{"name": "t", "content": "ok"}],
        )
    )
    assert small.sections["tool_results"].reason == "all_fit"
    assert small.sections["memory"].tokens > 4096 * 0.7  # the tools' unused share went to memory
    big = build_context(
        ContextRequest(
            max_tokens=4096, shares=BudgetShares(), turns=_turns(1), tool_results=[{"name": "t", "content": "x " * 9000}]
        )
    )
    assert int(4096 * 0.12) - 8 <= big.sections["tool_results"].tokens <= int(4096 * 0.12)
    assert "tool_result_truncated" in big.notes


@pytest.mark.parametrize("seed", range(60))
def test_invariants_hold_for_random_requests(seed):
    """Never over the limit, exact counts, newest turn whole, contiguous history, tool pairs whole,
    memories in rank order as far as they go."""
    rng = random.Random(seed)
    turns = []
    for seq in range(1, rng.randint(1, 120)):
        if rng.random() < 0.1 and turns and turns[-1]["role"] == "user":
            call = {"id": f"c{seq}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            turns.append({"seq": seq, "role": "assistant", "content": "", "tool_calls": [call]})
            turns.append({"seq": seq + 1000, "role": "tool", "tool_call_id": f"c{seq}", "content": "r " * rng.randint(1, 300)})
        else:
            turns.append({"seq": seq, "role": rng.choice(["user", "assistant"]), "content": "w " * rng.randint(1, 80)})
    max_tokens = rng.choice([600, 1024, 2048, 4096, 8192])
    request = ContextRequest(
        max_tokens=max_tokens,
        shares=BudgetShares(memory=rng.uniform(0, 0.3), history=rng.uniform(0, 0.6), tools=rng.uniform(0, 0.1), output=0.06),
        summary=rng.choice([None, "summary " * rng.randint(1, 400)]),
        turns=turns,
        facts=[f"k{i} (fact): v{i}" for i in range(rng.randint(0, 5))],
        memories=_memories(rng.randint(0, 120), words=rng.randint(2, 40)),
        tool_results=[{"name": "t", "content": "x " * rng.randint(1, 500)} for _ in range(rng.randint(0, 2))],
    )
    try:
        result = build_context(request)
    except BudgetError:
        assert count_block([turns[-1]]) > max_tokens * 0.5 or any(t["role"] == "tool" for t in turns[-3:])
        return
    assert result.total_tokens == count_chat(result.messages, add_generation_prompt=True) <= result.limit
    assert sum(s.tokens for k, s in result.sections.items() if k != "output_reserved") == result.total_tokens
    kept = [t for t in turns if t["seq"] in set(result.included_seqs)]
    assert kept == turns[len(turns) - len(kept) :] and kept  # a newest suffix, never empty
    for i, turn in enumerate(turns):
        if turn.get("tool_calls"):
            assert (turn in kept) == (turns[i + 1] in kept)
    used = result.memories_used
    assert used == list(range(len(used)))  # distinct memories: taken best first, none skipped


def test_memory_lines_group_by_session_date_once_and_merge_an_exchange():
    memories = [
        MemoryItem("assistant: Yes, last Tuesday!", "2023-05-08", "s1", 5),
        MemoryItem("user: I ran a charity race.", "2023-06-01", "s2", 3),
        MemoryItem("user: Did you go to the support group?", "2023-05-08", "s1", 4),
        MemoryItem("user: Did you go to the support group?", "2023-05-09", "s3", 9),  # the same words again
        MemoryItem("user: did you go to the SUPPORT group", "2023-05-08", "s1", 12),  # near-duplicate
        MemoryItem("user: Painting calms me.", "2023-05-08", "s1", 20),
    ]
    result = build_context(ContextRequest(max_tokens=2048, shares=BudgetShares(), turns=_turns(1), memories=memories))
    system = result.messages[0]["content"]
    section = system[system.index("# Relevant memories") :]
    assert section == (
        "# Relevant memories from earlier conversations\n"
        "[2023-05-08]\n"
        "- user: Did you go to the support group?\n"
        "  assistant: Yes, last Tuesday!\n"
        "- user: Painting calms me.\n"
        "[2023-06-01]\n"
        "- user: I ran a charity race."
    )
    assert result.memories_used == [0, 1, 2, 5]  # rank order; the duplicates are skipped
    assert system.count("2023-05-08") == 1


def test_memory_lines_are_taken_in_rank_order_when_room_runs_short():
    memories = _memories(60, words=8)
    result = build_context(ContextRequest(max_tokens=1024, shares=BudgetShares(), turns=_turns(1), memories=memories))
    used = result.memories_used
    assert 5 < len(used) < 60 and used == list(range(len(used)))
    system = result.messages[0]["content"]
    assert all(memories[i].text in system for i in used) and memories[len(used)].text not in system


STANDING = ["[2024-05-01] Always format dates as YYYY-MM-DD.", "[2024-05-03] I love jazz.", "[2024-06-09] Call me Sam."]


def test_standing_lines_have_a_section_of_their_own_before_the_facts():
    result = build_context(
        ContextRequest(
            max_tokens=2048,
            shares=BudgetShares(),
            turns=_turns(3),
            standing=STANDING,
            facts=["city (fact): Oslo"],
            memories=_memories(2),
        )
    )
    system = result.messages[0]["content"]
    assert system.index(STANDING_HEADER) < system.index("# Known facts") < system.index("# Relevant memories")
    section = system[system.index(STANDING_HEADER) : system.index("\n\n# Known facts")]
    assert section == STANDING_HEADER + "".join(f"\n- {line}" for line in STANDING)
    assert result.standing_used == 3 and result.facts_used == 1 and result.sections["memory"].reason == "all_fit"
    assert result.total_tokens == count_chat(result.messages, add_generation_prompt=True) <= result.limit
    assert sum(s.tokens for k, s in result.sections.items() if k != "output_reserved") == result.total_tokens


def test_a_recalled_turn_that_says_a_standing_line_is_not_quoted_again_unless_the_line_is_left_out():
    turn = MemoryItem("user: I love jazz!", "2024-05-03", "s1", 4)
    other = MemoryItem("user: The concert is on Friday.", "2024-05-03", "s1", 6)
    request = ContextRequest(
        max_tokens=2048,
        shares=BudgetShares(),
        turns=_turns(1),
        standing=["[2024-05-03] I love jazz."],
        standing_said=["I love jazz."],
        memories=[turn, other],
    )
    shown = build_context(request)
    system = shown.messages[0]["content"]
    assert shown.standing_used == 1 and "I love jazz!" not in system and shown.memories_used == [1]
    left_out = build_context(replace(request, standing_share=0.0))
    assert (
        left_out.standing_used == 0
        and left_out.memories_used == [0, 1]
        and "user: I love jazz!" in left_out.messages[0]["content"]
    )


def test_standing_lines_alone_make_the_memory_section_and_count_in_it():
    bare = build_context(ContextRequest(max_tokens=2048, shares=BudgetShares(), turns=_turns(3)))
    result = build_context(ContextRequest(max_tokens=2048, shares=BudgetShares(), turns=_turns(3), standing=STANDING[:1]))
    assert bare.sections["memory"].reason == "empty" and result.sections["memory"].reason == "all_fit"
    assert result.sections["memory"].tokens == result.total_tokens - bare.total_tokens > 0


@pytest.mark.parametrize("share", [0.0, 0.05, 0.25, 1.0])
def test_standing_lines_take_at_most_their_share_of_memorys_grant_first_ones_first(share):
    many = [f"[2024-01-{1 + i % 28:02d}] Always mention rule number {i} " + "word " * 10 for i in range(200)]
    result = build_context(
        ContextRequest(
            max_tokens=4096,
            shares=BudgetShares(),
            turns=_turns(1),
            standing=many,
            standing_share=share,
            memories=_memories(50),
        )
    )
    system = result.messages[0]["content"]
    memory = result.sections["memory"]
    taken = system.count("Always mention rule number")
    assert taken == result.standing_used < len(many)
    assert all(f"rule number {i} " in system for i in range(taken))
    cap = int(memory.budget * share)
    standing_tokens = count_tokens(STANDING_HEADER + "".join(f"\n- {line}" for line in many[:taken])) if taken else 0
    assert standing_tokens <= cap + 2  # counted alone; within the prompt a line start adds nothing
    assert (taken == 0) == (share < 0.01)
    assert memory.reason == "room" and bool(result.memories_used) == (share < 1)  # the rest of the grant went to recall
    assert result.total_tokens == count_chat(result.messages, add_generation_prompt=True) <= result.limit


standing_lines = st.lists(
    st.lists(st.sampled_from([*AWKWARD, "Always ", "use ", "\n", "\n- ", "[2024-05-01] "]), max_size=12).map("".join),
    max_size=30,
)


@hypothesis_settings(max_examples=120, deadline=None)
@given(
    standing=standing_lines,
    share=st.floats(0, 1),
    max_tokens=st.sampled_from([400, 700, 1200, 4096]),
    summary=st.booleans(),
    facts=st.integers(0, 5),
    memories=st.integers(0, 30),
    turns=st.integers(1, 60),
    tools=st.booleans(),
)
def test_standing_lines_never_take_the_prompt_over_the_limit(standing, share, max_tokens, summary, facts, memories, turns, tools):
    request = ContextRequest(
        max_tokens=max_tokens,
        shares=BudgetShares(),
        summary="summary " * 60 if summary else None,
        turns=_turns(turns, words=8),
        standing=standing,
        standing_share=share,
        facts=[f"k{i} (fact): v{i}" for i in range(facts)],
        memories=_memories(memories),
        tool_results=[{"name": "t", "content": "x " * 300}] if tools else [],
    )
    result = build_context(request)
    assert result.total_tokens == count_chat(result.messages, add_generation_prompt=True) <= result.limit
    assert sum(s.tokens for k, s in result.sections.items() if k != "output_reserved") == result.total_tokens
    assert result.standing_used <= len(standing)
    assert result.sections["memory"].tokens <= result.sections["memory"].budget
