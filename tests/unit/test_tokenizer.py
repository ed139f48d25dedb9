"""Golden values of Qwen2.5's tokenizer and chat template."""

from serve_app.core.tokenizer import count_block, count_chat, encode, render_chat


def test_plain_text_golden_ids():
    assert encode("Hello, world! 你好世界") == [9707, 11, 1879, 0, 220, 108386, 99489]


def test_tool_call_is_one_special_token():
    assert encode("<tool_call>") == [151657]
    assert encode("</tool_call>") == [151658]


def test_chat_template_golden():
    messages = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "你好"}]
    ids = encode(render_chat(messages))
    assert ids == [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198, 108386, 151645, 198]
    assert count_chat(messages) == 17
    assert count_chat(messages, add_generation_prompt=True) == 20


def test_default_system_prompt_is_counted_when_none_given():
    with_default = count_chat([{"role": "user", "content": "hi"}])
    explicit = count_chat(
        [
            {"role": "system", "content": "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."},
            {"role": "user", "content": "hi"},
        ]
    )
    assert with_default == explicit


def test_tool_turns_render_like_the_template():
    messages = [
        {"role": "system", "content": "s"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "lookup", "arguments": '{"order": "A1"}'}}]},
        {"role": "tool", "content": "shipped"},
        {"role": "tool", "content": "eta 2d"},
    ]
    text = render_chat(messages)
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "lookup", "arguments": {"order": "A1"}}\n</tool_call><|im_end|>\n' in text
    )
    # Consecutive tool results share one user turn.
    assert text.endswith(
        "<|im_start|>user\n<tool_response>\nshipped\n</tool_response>\n<tool_response>\neta 2d\n</tool_response><|im_end|>\n"
    )


def test_blocks_add_up_to_the_whole_chat():
    turns = [
        {"role": "user", "content": "  leading spaces and\n\nnewlines "},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
        {"role": "tool", "content": "r1"},
        {"role": "assistant", "content": "done 123"},
    ]
    system = {"role": "system", "content": "sys"}
    total = count_chat([system, *turns])
    parts = count_chat([system]) + count_block(turns[:1]) + count_block(turns[1:3]) + count_block(turns[3:])
    assert parts == total


def test_the_count_cache_keeps_no_copy_of_long_texts():
    """Counts are cached (a session's turns and a user's memories are counted on every context), and a
    long text must not stay in memory for having been counted once: an ingress counts thousands of
    tool results and system prompts of up to 64 KB. Long texts are remembered by digest."""
    import tracemalloc

    from serve_app.core.tokenizer import count_tokens

    texts = [f"tool output {i}: " + "lorem ipsum dolor sit amet " * 4000 for i in range(3)]  # about 100 KB each
    expected = [len(encode(t)) for t in texts]
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for i in range(40):
            text = f"distinct {i} " + "x y z " * 20_000  # 120 KB, dropped after counting
            assert count_tokens(text) > 0
            del text
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held - before < 1_000_000, f"the count cache holds {(held - before) / 1e6:.1f} MB of counted text"
    assert [count_tokens(t) for t in texts] == expected
    assert [count_tokens(t) for t in texts] == expected  # counted again, or found by digest: the same
