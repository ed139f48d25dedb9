"""bench.beam's pure parts: reading a conversation in BEAM's layout (a made-up one, written here) and
deciding whether a long message's evidence is in a prompt."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from bench.beam_data import load_conversation, source_ids, truncated
from bench.beam_evidence import Corpus, PromptText, answer_passage, passages

LONG = " ".join(f"Step {i} of the plan configures the widget number {i} with care." for i in range(40))
CHAT = [
    {
        "batch_number": 1,
        "time_anchor": None,
        "turns": [
            [
                {"role": "user", "id": 0, "time_anchor": "March-15-2024", "content": "Always answer in French."},
                {"role": "assistant", "id": 1, "content": LONG},
            ]
        ],
    },
    {
        "batch_number": 2,
        "time_anchor": "April-02-2024",
        "turns": [
            [
                {"role": "user", "id": 2, "content": "My deadline moved to May 3."},
                {"role": "assistant", "id": 3, "content": "Noted."},
            ]
        ],
    },
]
QUESTIONS = {
    "abstention": [{"question": "What did I eat?", "ideal_response": "Not said."}],
    "knowledge_update": [
        {"question": "When is my deadline?", "answer": "May 3", "source_chat_ids": {"original_info": [0], "updated_info": [2]}}
    ],
    "event_ordering": [{"question": "In what order?", "answer": "first, then", "source_chat_ids": [[0, 2], [1], [2]]}],
    "instruction_following": [
        {"question": "Tell me about widgets.", "instruction_being_tested": "Always answer in French.", "source_chat_ids": [0]}
    ],
    "information_extraction": [{"question": "Unsourced?", "answer": "x", "source_chat_ids": []}],
}


def write_conversation(folder) -> None:
    (folder / "probing_questions").mkdir(parents=True)
    (folder / "chat.json").write_text(json.dumps(CHAT))
    (folder / "probing_questions" / "probing_questions.json").write_text(json.dumps(QUESTIONS))


def test_messages_carry_their_batch_date_and_questions_their_distinct_sources(tmp_path):
    write_conversation(tmp_path / "7")
    conversation = load_conversation(tmp_path / "7")
    assert [(m.id, m.role, m.batch) for m in conversation.messages] == [
        (0, "user", 1),
        (1, "assistant", 1),
        (2, "user", 2),
        (3, "assistant", 2),
    ]
    assert conversation.messages[1].when == datetime(2024, 3, 15, tzinfo=UTC)  # the first anchored message dates its batch
    assert conversation.messages[2].when == datetime(2024, 4, 2, tzinfo=UTC)
    questions = {q.ability: q for q in conversation.questions}
    assert set(questions) == {"knowledge_update", "event_ordering", "instruction_following"}  # no abstention, no empty sources
    assert questions["knowledge_update"].sources == (0, 2)
    assert questions["event_ordering"].sources == (0, 2, 1)
    assert questions["instruction_following"].answer == "Always answer in French."


def test_source_ids_flatten_lists_objects_and_nested_lists_once():
    assert source_ids({"a": [3, [4, 3]], "b": 5}) == [3, 4, 5]


def test_truncation_cuts_sources_to_the_messages_kept(tmp_path):
    write_conversation(tmp_path / "1")
    short = truncated(load_conversation(tmp_path / "1"), 2)
    assert len(short.messages) == 2
    assert {q.ability: q.sources for q in short.questions} == {
        "knowledge_update": (0,),
        "event_ordering": (0, 1),
        "instruction_following": (0,),
    }


def test_passages_end_at_sentences_and_stay_near_the_size():
    chunks = passages(LONG)
    assert len(chunks) > 3
    assert all(len(c) <= 600 for c in chunks)
    assert all(c.endswith(".") for c in chunks)
    assert " ".join(chunks) == LONG


def test_a_sentence_longer_than_a_passage_is_cut():
    assert [len(c) for c in passages("x" * 1300)] == [600, 600, 100]


def test_the_answer_passage_is_the_one_sharing_most_words_with_the_answer():
    index, passage = answer_passage(LONG, "widget number 33")
    assert "widget number 33" in passage
    assert index == next(i for i, c in enumerate(passages(LONG)) if "widget number 33" in c)


def test_a_quoted_passage_counts_whatever_the_spacing_and_case():
    index, passage = answer_passage(LONG, "widget number 33")
    prompt = PromptText("# Memories\n- assistant: " + passage.upper().replace(" ", "\n  "))
    assert prompt.quotes_passage(passage)
    assert prompt.quotes_any(LONG)
    assert not prompt.quotes_passage(passages(LONG)[0])


def test_most_of_a_passage_quoted_counts_and_a_fragment_does_not():
    passage = passages(LONG)[1]
    assert PromptText(passage[: int(len(passage) * 0.9)]).quotes_passage(passage)
    assert not PromptText(passage[:200]).quotes_passage(passage)
    assert PromptText(passage[:200]).quotes_any(passage)


def test_a_short_message_counts_only_whole():
    assert PromptText("- user: Always answer in French.").quotes_any("Always answer in French.")
    assert not PromptText("- user: Always answer in").quotes_any("Always answer in French.")


def test_a_span_other_messages_also_hold_does_not_show_a_message_quoted():
    shared = "server.listen(3000, () => console.log('listening on port 3000')); // the boilerplate every turn pastes"
    first, second = f"First question about sockets. {shared}", f"Second question about rooms. {shared}"
    prompt = PromptText(second)
    corpus = Corpus([first, second])
    assert prompt.quotes_any(second, corpus)
    assert not prompt.quotes_any(first, corpus)
    assert prompt.quotes_any(first)  # without the corpus the shared span alone would count


def test_the_unrelated_share_is_their_memory_tokens_over_an_answerable_questions():
    from bench.beam import unrelated_share

    rows = [
        {"ability": "x", "memory tokens@2048": 1000},
        {"ability": "x", "memory tokens@2048": 600},
        {"unrelated": "Who painted it?", "memory tokens@2048": 40},
        {"unrelated": "Write a haiku.", "memory tokens@2048": 120},
    ]
    figures = unrelated_share(rows, [2048])
    assert figures["questions"] == 2 and figures["memory tokens@2048"] == 80
    assert figures["share@2048"] == 80 / 800


def test_bench_memorize_takes_only_long_messages_as_long_turns_in_conversation_order(tmp_path):
    from bench.memorize import long_turns

    write_conversation(tmp_path / "2")
    write_conversation(tmp_path / "10")
    assert long_turns(tmp_path, 5, min_chars=len(LONG)) == [LONG, LONG]
    assert long_turns(tmp_path, 1, min_chars=len(LONG)) == [LONG]
    assert long_turns(tmp_path, 5, min_chars=len(LONG) + 1) == []
