"""Long turns as passages (core/passages.py) and how passages read in a prompt (core/memory_lines.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.core.memory_lines import MemoryItem, passage_item, render
from serve_app.core.passages import passage_id, passage_place, split_passages, turn_of
from serve_app.llm.prompts import clip_middle

TARGET, WHOLE = 600, 1000


def _paragraph(topic: str, n: int) -> str:
    return " ".join(f"Sentence {i} of the part about {topic} adds one more detail." for i in range(n))


def test_a_turn_up_to_whole_is_one_passage_itself():
    text = "  A turn with its spacing kept.  "
    assert split_passages(text, target=TARGET, whole=WHOLE) == [text]
    assert split_passages("x" * WHOLE, target=TARGET, whole=WHOLE) == ["x" * WHOLE]


def test_a_long_turn_is_cut_at_its_paragraphs_and_sentences():
    paragraphs = [_paragraph(topic, 6) for topic in ("the budget", "the hiring plan", "the launch date", "the office move")]
    text = "\n\n".join(paragraphs)
    passages = split_passages(text, target=TARGET, whole=WHOLE)
    assert len(passages) > 1
    assert all(len(p) <= TARGET + TARGET // 3 for p in passages)
    # Every passage ends where a sentence does, and nothing is lost or repeated.
    assert all(p.endswith(".") for p in passages)
    assert " ".join(" ".join(passages).split()) == " ".join(text.split())


def test_a_log_without_sentences_is_cut_at_lines_and_a_blob_inside_a_word():
    log = "\n".join(f"2026-12-0{i % 9 + 1} INFO worker-{i} finished job {i}" for i in range(200))
    passages = split_passages(log, target=TARGET, whole=WHOLE)
    assert all(p.startswith("2026-12-0") and len(p) <= TARGET + TARGET // 3 for p in passages)
    blob = "A" * 5000
    assert "".join(split_passages(blob, target=TARGET, whole=WHOLE)) == blob


@settings(max_examples=200, deadline=None)
@given(
    st.text(alphabet=st.sampled_from("ab .!?\n"), min_size=0, max_size=6000),
    st.integers(100, 900),
)
def test_passages_cover_the_text_in_order_and_stay_within_their_length(text, target):
    whole = target + 200
    passages = split_passages(text, target=target, whole=whole)
    if len(text) <= whole:
        assert passages == [text]
        return
    assert "".join("".join(passages).split()) == "".join(text.split())
    assert all(p and len(p) <= target + target // 3 for p in passages)
    # Each passage is a slice of the text, found after the one before it.
    at = 0
    for passage in passages:
        found = text.find(passage, at)
        assert found >= at
        at = found + len(passage)


def test_a_passage_id_carries_its_place_and_other_ids_none():
    assert passage_place(passage_id("t0123abcd", 3, 7)) == (3, 7)
    assert passage_place("t0123abcd") is None
    assert passage_place("note.p9-2") is None  # no place past the end
    assert passage_place("m-notes.v2") is None
    assert turn_of(passage_id("t0123abcd", 3, 7)) == "t0123abcd" and turn_of("my.plan.p") == "my.plan.p"


def _passage(part: int, body: str, parts: int = 5, seq: int = 4) -> MemoryItem:
    return passage_item("assistant", body, "2026-03-02", "s1", seq, part, parts)


def test_passages_of_one_turn_read_as_one_quote_with_gaps_marked():
    alone = _passage(2, "Second.")
    assert alone.text == "assistant: … Second. …"
    section = render(
        [_passage(4, "Fourth."), _passage(1, "First."), _passage(2, "Second."), MemoryItem("user: Hi", "2026-03-02", "s1", 3)]
    )
    assert section.count("\n- ") == 1  # one bullet: the question, its answer's passages under it
    assert "\n  assistant: First. Second. … Fourth. …" in section
    assert section.index("user: Hi") < section.index("First.")
    whole_turn = render([_passage(1, "Start.", parts=2), _passage(2, "End.", parts=2)])
    assert whole_turn.endswith("- assistant: Start. End.")


def test_a_turn_longer_than_the_models_input_is_read_with_its_ends():
    text = "ASK " + "x" * 40_000 + " CONCLUSION"
    clipped = clip_middle(text, 1000)
    assert clipped.startswith("ASK ") and clipped.endswith(" CONCLUSION") and len(clipped) < 1100
    assert "characters left out" in clipped and clip_middle("short", 1000) == "short"
