"""Where a memory's sentences are (pure): what the document embedding averages over."""

from serve_app.core.sentences import MAX_SENTENCES, sentences


def test_a_turn_splits_after_each_closing_mark_and_at_line_breaks():
    text = "Wow, Caroline! I just signed up for a pottery class. Is it therapy? Maybe\u2026 it is.\nNext line\n\n  last"
    assert sentences(text) == [
        "Wow, Caroline!",
        "I just signed up for a pottery class.",
        "Is it therapy?",
        "Maybe\u2026",
        "it is.",
        "Next line",
        "last",
    ]


def test_marks_inside_a_sentence_do_not_split_it():
    assert sentences("Order ORD-44.1 cost $3.50 at 10.30am.") == ["Order ORD-44.1 cost $3.50 at 10.30am."]


def test_one_sentence_or_none():
    assert sentences("  Thanks!  ") == ["Thanks!"]
    assert sentences("") == [] and sentences(" \n ") == []


def test_a_long_text_embeds_its_first_sentences_only():
    assert sentences("Yes. " * (MAX_SENTENCES + 10)) == ["Yes."] * MAX_SENTENCES
