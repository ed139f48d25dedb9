"""Pure recall logic: keyword normalization, query timeframes, rank fusion and its floor."""

from datetime import UTC, date, datetime

import pytest

from serve_app.core.keywords import context_tail, day_words, memory_keywords, normalize, query_terms, terms
from serve_app.core.ranking import FusionParams, Scored, explain, fuse
from serve_app.core.timeframe import Timeframe, query_timeframe


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_terms_drop_stop_words_and_stem():
    assert terms("Who adopted the puppies?") == ["adopt", "puppi"]
    assert normalize("Running, RUNS; ran!") == "run run ran"
    assert normalize("the of and") == ""
    assert normalize("café Zürich 2023") == "café zürich 2023"


def test_a_query_asks_by_what_the_conversation_was_about_not_by_how_it_asks():
    """Words that ask about the conversation itself ("did I mention", "summarize what we
    discussed") are rare in what people say, so they would weigh most in the query and match
    nothing that answers it; they are dropped from queries only, and only when other words remain."""
    asked = "Can you summarize what we discussed about the garden in our conversations? Did I mention roses?"
    assert query_terms(asked).split() == ["garden", "rose"]
    assert query_terms("When did Caroline go to the support group?") == "carolin support group"
    assert query_terms("What did I say?") == "did say"  # nothing else left: kept
    assert normalize("We discussed roses and you did mention them.") == "discuss rose did mention"  # memories keep them


def test_memory_keywords_carry_context_date_and_weight():
    text = memory_keywords("Yes, last Tuesday!", before=["Did you visit the vet?"], day=date(2023, 5, 8), weight=2)
    assert text.split()[3:] == "did visit vet yes tuesday yes tuesday".split()  # "last" is a stop word, "yes" and "did" are not
    assert set(day_words(date(2024, 12, 1)).split()) >= set(normalize("1 December 2024").split())
    assert memory_keywords("hello there") == "hello hello"


def test_a_memory_carries_only_the_end_of_a_long_turn_before_it():
    answer = "Kubernetes operators reconcile custom resources. " * 40 + "Shall I book the dentist for Friday afternoon?"
    text = memory_keywords("Yes please.", before=[answer], context_chars=60)
    assert "kubernet" not in text.split()  # the long answer's start is not the reply's
    assert {"book", "dentist", "friday", "afternoon", "yes"} <= set(text.split())
    assert memory_keywords("Yes please.", before=["Shall I book it?"], context_chars=60).startswith("shall book")


def test_the_context_tail_starts_at_a_word():
    assert context_tail("alpha beta gamma", 8) == " gamma"  # the cut fell inside "beta"
    assert context_tail("alpha beta gamma", 6) == " gamma"
    assert context_tail("alpha beta gamma", 5) == "gamma"
    assert context_tail("short", 300) == "short"


@pytest.mark.parametrize(
    ("day", "query", "shared"),
    [
        (date(2023, 5, 8), "What did we do in May 2023?", 2),
        (date(2023, 5, 8), "what happened on 8 May?", 2),
        (date(2023, 5, 8), "May 8th, 2023", 3),
        (date(2023, 7, 7), "What happened on 7 July?", 2),
        (date(2023, 7, 7), "July 7th", 2),
        (date(2023, 7, 7), "Where was she in July 2023?", 2),
        (date(2023, 7, 7), "on the 7th of July, 2023", 3),
        (date(2023, 8, 14), "in August", 1),
        (date(2023, 3, 2), "March 2, 2023", 3),
    ],
)
def test_the_date_words_of_a_memory_meet_the_date_words_of_queries(day, query, shared):
    """Queries name dates the way people write them; the memory's date words must be the same terms."""
    assert len(set(day_words(day).split()) & set(normalize(query).split())) >= shared, (day_words(day), normalize(query))


def test_a_month_that_is_also_a_word_is_a_month_only_beside_a_date():
    may, march = set(day_words(date(2023, 5, 8)).split()), set(day_words(date(2023, 3, 2)).split())
    assert may.isdisjoint(normalize("You may go now, it may rain").split())
    assert march.isdisjoint(normalize("We march on").split())
    assert may & set(normalize("in May").split()) and march & set(normalize("early March").split())


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("What happened on 7 July, 2023?", Timeframe(utc(2023, 7, 6), utc(2023, 7, 9))),
        ("What did she do on August 3, 2023?", Timeframe(utc(2023, 8, 2), utc(2023, 8, 5))),
        ("Plans for 2024-02-29?", Timeframe(utc(2024, 2, 28), utc(2024, 3, 2))),
        ("Trips in December 2023", Timeframe(utc(2023, 12, 1), utc(2024, 1, 1))),
        ("When did Melanie go camping in June?", Timeframe(month=6)),
        ("What changed in 2022?", Timeframe(utc(2022, 1, 1), utc(2023, 1, 1))),
        ("What is her favourite colour?", None),
        ("I may go there", None),
        ("on 31 February, 2023", Timeframe(utc(2023, 2, 1), utc(2023, 3, 1))),  # no such day: the month
    ],
)
def test_query_timeframe(query, expected):
    assert query_timeframe(query) == expected


def test_timeframe_contains():
    assert Timeframe(month=6).contains(utc(2021, 6, 30))
    assert not Timeframe(utc(2023, 7, 1), utc(2023, 8, 1)).contains(utc(2023, 8, 1))


def test_fusion_rewards_agreement_and_weights():
    dense = [Scored("a", 0.9), Scored("b", 0.8), Scored("c", 0.7)]
    keyword = [Scored("c", 12.0), Scored("d", 9.0)]
    ranked = [f.id for f in fuse(dense, keyword, FusionParams(dense_weight=0.5, keyword_weight=1.0, rrf_k=20))]
    assert ranked[0] == "c"  # found by both
    assert ranked.index("d") < ranked.index("b")  # keyword rank 2 outweighs dense rank 2 at these weights
    dense_only = fuse(dense, keyword, FusionParams(keyword_weight=0.0))
    assert [f.id for f in dense_only][:3] == ["a", "b", "c"]


def test_floor_drops_memories_weak_on_both_sides():
    dense = [Scored("close", 0.6), Scored("far", 0.1)]
    keyword = [Scored("words", 10.0), Scored("weak-words", 1.0)]
    kept = {f.id for f in fuse(dense, keyword, FusionParams(min_similarity=0.25, min_keyword_share=0.3))}
    assert kept == {"close", "words"}
    everything = {f.id for f in fuse(dense, keyword, FusionParams(min_similarity=-1))}
    assert everything == {"close", "far", "words", "weak-words"}


def test_coverage_floor_keeps_out_the_best_of_weak_keyword_matches():
    """The share floor is relative: the best keyword match always passes it. A memory that matches
    one common word of a question about something else must not."""
    keyword = [Scored("one-word", 3.0, coverage=0.12), Scored("most-words", 2.5, coverage=0.8), Scored("unknown", 2.0)]
    params = FusionParams(min_similarity=0.25, min_keyword_share=0.3, min_keyword_coverage=0.3)
    assert {f.id for f in fuse([Scored("one-word", 0.1)], keyword, params)} == {"most-words", "unknown"}
    assert [f.id for f in fuse([], keyword[:1], params)] == []
    assert [f.id for f in fuse([Scored("one-word", 0.4)], keyword[:1], params)] == ["one-word"]  # meaning alone suffices


def test_coverage_floor_is_not_asked_of_a_query_about_the_users_memories():
    """A query whose nearest memory is close is about the user's memories: a weak keyword match of
    it is a lower candidate, not noise. A query whose nearest memory is far (a question about
    something else) still gets none of its one-word matches."""
    keyword = [Scored("most-words", 3.0, coverage=0.8), Scored("few-words", 2.0, coverage=0.15)]
    params = FusionParams(min_similarity=0.3, min_keyword_share=0.3, min_keyword_coverage=0.3, related_similarity=0.45)
    related = fuse([Scored("near", 0.45), Scored("few-words", 0.1)], keyword, params)
    assert {f.id for f in related} == {"near", "most-words", "few-words"}
    unrelated = fuse([Scored("near", 0.44), Scored("few-words", 0.1)], keyword, params)
    assert {f.id for f in unrelated} == {"near", "most-words"}
    assert [f.id for f in fuse([], keyword[1:], params)] == []  # no dense side: nothing says the query is related
    below_share = fuse([Scored("near", 0.9)], [*keyword, Scored("one-word", 0.5, coverage=0.1)], params)
    assert "one-word" not in {f.id for f in below_share}  # the share floor still holds
    verdicts = {v.fused.id: v.reason for v in explain([Scored("near", 0.44)], keyword, params)}
    assert verdicts["few-words"] == "keyword_coverage_floor"
    assert {v.fused.id: v.reason for v in explain([Scored("near", 0.45)], keyword, params)}["few-words"] == "keywords"


def test_explain_names_the_floor_that_dropped_each_candidate_and_keeps_what_fuse_keeps():
    dense = [Scored("close", 0.6), Scored("far", 0.1), Scored("one-word", 0.05)]
    keyword = [
        Scored("words", 10.0, coverage=0.9),
        Scored("one-word", 9.0, coverage=0.1),
        Scored("weak-words", 1.0, coverage=0.5),
    ]
    params = FusionParams(min_similarity=0.25, min_keyword_share=0.3, min_keyword_coverage=0.3)
    verdicts = {v.fused.id: v for v in explain(dense, keyword, params)}
    assert {i: v.reason for i, v in verdicts.items()} == {
        "close": "similarity",
        "words": "keywords",
        "far": "similarity_floor",
        "one-word": "keyword_coverage_floor",
        "weak-words": "keyword_share_floor",
    }
    assert verdicts["one-word"].dense_rank == 2 and verdicts["one-word"].keyword_rank == 1
    assert verdicts["one-word"].coverage == 0.1 and verdicts["far"].keyword_rank is None
    for limit in (None, 1):
        kept = [v.fused for v in explain(dense, keyword, params, limit=limit) if v.kept]
        assert kept == fuse(dense, keyword, params, limit=limit)
    beyond = [v for v in explain(dense, keyword, params, limit=1) if v.reason == "beyond_limit"]
    assert len(beyond) == 1 and beyond[0].fused.id in {"close", "words"}


def test_a_memory_no_keyword_matches_passes_no_keyword_floor_even_at_share_zero():
    """On words alone means some words: a zero share floor lets in every keyword match, not the
    dense candidates below the similarity floor that match no word."""
    params = FusionParams(min_similarity=0.25, min_keyword_share=0.0, min_keyword_coverage=0.0)
    kept = {f.id for f in fuse([Scored("far", 0.1), Scored("close", 0.5)], [Scored("weak-words", 0.01)], params)}
    assert kept == {"close", "weak-words"}


def test_time_boost_lifts_memories_from_the_named_window():
    dense = [Scored("old", 0.9, utc(2022, 1, 5)), Scored("june", 0.8, utc(2023, 6, 10))]
    plain = [f.id for f in fuse(dense, [], FusionParams(time_weight=1.0))]
    boosted = [f.id for f in fuse(dense, [], FusionParams(time_weight=1.0), Timeframe(month=6))]
    assert plain == ["old", "june"] and boosted == ["june", "old"]
    assert fuse(dense, [], FusionParams(), Timeframe(month=6))[0].in_timeframe


def test_limit_and_deterministic_ties():
    dense = [Scored(i, 0.5) for i in "zyx"]
    assert [f.id for f in fuse(dense, dense[::-1], limit=2)] == ["x", "y"]  # keyword weight 1.0 beats dense 0.5
    assert [f.id for f in fuse(dense, [])] == ["z", "y", "x"]
    assert [
        f.id for f in fuse([Scored("b", 0.5), Scored("a", 0.5)], [Scored("a", 1.0), Scored("b", 1.0)], FusionParams(1, 1))
    ] == ["a", "b"]


def test_pystemmer_gives_the_stems_of_snowballstemmer():
    """Keywords are stemmed by PyStemmer's C code when installed; its stems must be snowballstemmer's."""
    import re

    import Stemmer
    from snowballstemmer.english_stemmer import EnglishStemmer

    from serve_app.core import keywords
    from serve_app.core.stop_words import ENGLISH_STOP_WORDS

    assert isinstance(keywords._STEMMER, Stemmer.Stemmer)
    words = set(ENGLISH_STOP_WORDS) | set(re.findall(r"[a-z]+", (keywords.__doc__ or "").lower()))
    words |= {"running", "adopted", "puppies", "generously", "happiness", "organizational", "caresses", "ponies"}
    pure = EnglishStemmer()
    assert {w: keywords._STEMMER.stemWord(w) for w in words} == {w: pure.stemWord(w) for w in words}


def test_iso_day_is_the_utc_date_of_the_instant():
    from serve_app.core.clock import iso_day, ms_to_datetime

    for ms in (0, 1, 86_399_999, 86_400_000, 1_683_504_000_000, 4_102_444_799_999):
        assert iso_day(ms) == ms_to_datetime(ms).date().isoformat()
