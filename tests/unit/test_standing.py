"""Standing instructions and preferences, the pure part: which sentences hold from then on, when
two are on the same thing, which key a rule is kept under, and which rules bear on a request."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.core.ids import ID_PATTERN
from serve_app.core.standing import (
    MAX_KEY_CHARS,
    Rule,
    bears_on,
    key_for,
    key_words,
    same_thing,
    standing_rules,
    topic_words,
)

RULES = [
    ("Always format dates as YYYY-MM-DD.", "instruction"),
    ("From now on, reply in French.", "instruction"),
    ("Going forward please cc my assistant on every email.", "instruction"),
    ("Please use British spelling.", "instruction"),
    ("Call me Sam.", "instruction"),
    ("Don't ever call me Bob.", "instruction"),
    ("I want you to always answer in bullet points.", "instruction"),
    ("When you write code, always use type hints.", "instruction"),
    ("When you answer, always be brief.", "instruction"),
    ("Thanks, and from now on reply in French.", "instruction"),
    ("Make sure to double-check the units.", "instruction"),
    ("I love jazz.", "preference"),
    ("I'd rather sit by the window.", "preference"),
    ("My favourite colour is blue.", "preference"),
    ("I'm allergic to peanuts.", "preference"),
    ("I don't eat pork.", "preference"),
    ("Remember that I'm vegetarian.", "preference"),
    ("I always take the train to work.", "preference"),  # a habit: a preference at most
]

NOT_RULES = [
    "Please ship it to my office instead.",  # a one-off request
    "Please keep it short.",  # about the thing at hand
    "Use metric units this time.",
    "Can you always reply in French?",  # a question is not a rule
    "What do you always say?",
    "Never mind.",
    "Rex eats fish, never chicken.",  # a statement, not a command
    "About the limit per minute, never the double.",
    "Thanks, always appreciated.",
    "I never said that.",
    "I love it!",
    "I like that idea.",
    "I'd like to book a table for two.",
    "Book the place I like.",
    "My office is in Berlin.",
    "I moved, my office is now in Munich.",
    "When is my dentist appointment?",
]


@pytest.mark.parametrize(("sentence", "kind"), RULES)
def test_rules_are_found_with_their_kind(sentence, kind):
    assert standing_rules(sentence) == [Rule(sentence, kind)]


@pytest.mark.parametrize("sentence", NOT_RULES)
def test_what_does_not_hold_from_then_on_is_no_rule(sentence):
    assert standing_rules(sentence) == []


def test_a_turn_gives_its_rule_sentences_in_order_and_the_later_of_two_on_the_same_thing():
    turn = (
        "Thanks for the help yesterday. Always format dates as YYYY-MM-DD. "
        "What is the weather like? I love jazz. Actually, always format dates as DD.MM.YYYY."
    )
    assert standing_rules(turn) == [
        Rule("I love jazz.", "preference"),
        Rule("Actually, always format dates as DD.MM.YYYY.", "instruction"),
    ]


def test_on_the_same_thing_is_a_jaccard_of_topic_words_of_at_least_a_half():
    assert topic_words("Always format dates as YYYY-MM-DD.") == ["format", "date", "yyyi", "mm", "dd"]  # stems
    assert same_thing("Always format dates as YYYY-MM-DD.", "From now on, format dates as DD/MM/YYYY.")
    assert same_thing("Always use metric units.", "Always use imperial units.")  # 2 of 4 words
    assert same_thing("I love jazz.", "I hate jazz.")
    assert same_thing("My favourite colour is blue.", "My favourite colour is green.")  # about the colour
    assert not same_thing("Always use metric units.", "Always use bullet points.")
    assert not same_thing("Reply in French.", "Always format dates as YYYY-MM-DD.")
    assert not same_thing("Reply in French.", "Reply in German.")  # documented: one word of substance each


def test_a_rule_is_kept_under_the_key_of_the_rule_on_the_same_thing():
    rule = Rule("From now on, format dates as DD/MM/YYYY.", "instruction")
    existing = [
        ("preference.jazz", "I love jazz."),
        ("instruction.format-dates-yyyy-mm-dd", "Thanks! Always format dates as YYYY-MM-DD."),  # the whole short turn
    ]
    assert key_for(rule, existing) == "instruction.format-dates-yyyy-mm-dd"
    assert key_for(Rule("Call me Sam.", "instruction"), existing) == "instruction.sam"
    assert key_for(Rule("My favourite colour is blue.", "preference"), []) == "preference.colour"
    # A new key another fact holds already is made distinct.
    taken = key_for(Rule("Call me Sam.", "instruction"), [], taken={"instruction.sam"})
    assert taken.startswith("instruction.sam-") and taken != "instruction.sam"


@pytest.mark.parametrize(
    ("rule", "kind", "query", "bears"),
    [
        ("Always format dates as YYYY-MM-DD.", "instruction", "When is my dentist appointment?", True),  # unconditional
        ("Always format dates as YYYY-MM-DD.", "instruction", "What is the boiling point of mercury?", True),
        ("Whenever I ask for a recipe, use metric units.", "instruction", "A recipe for pancakes, please", True),
        ("Whenever I ask for a recipe, use metric units.", "instruction", "When is my dentist appointment?", False),
        ("When you write code, always use type hints.", "instruction", "Fix this code for me", True),
        ("When you write code, always use type hints.", "instruction", "Plan my trip to Rome", False),
        ("Please use British spelling for everything.", "instruction", "Plan my trip to Rome", True),
        ("When you answer, always be brief.", "instruction", "Plan my trip to Rome", True),  # every answer
        ("I love jazz.", "preference", "Any jazz concerts in town this week?", True),
        ("I love jazz.", "preference", "When is my dentist appointment?", False),
    ],
)
def test_what_bears_on_a_request(rule, kind, query, bears):
    assert bears_on(rule, kind, query) is bears


def test_a_stored_rule_is_matched_by_its_key_words_too():
    assert key_words("favorite_language") == "favorite language" and key_words("preference.jazz") == "jazz"
    assert bears_on("Go", "preference", "Which language should I learn next?", about=key_words("favorite_language"))
    assert not bears_on("Go", "preference", "Which language should I learn next?")
    # The key's words never make an instruction conditional.
    assert bears_on("Reply in French.", "instruction", "hello", about=key_words("reply_language_for_answers"))


rules = st.sampled_from([sentence for sentence, _ in RULES]).map(lambda s: standing_rules(s)[0])
values = st.sampled_from([s for s, _ in RULES] + NOT_RULES)
stored = st.lists(
    st.tuples(st.sampled_from(["k1", "k2", "k3", "preference.jazz"]), values), max_size=4, unique_by=lambda kv: kv[0]
)


@settings(max_examples=200, deadline=None)
@given(rule=rules, existing=stored, prefix=st.sampled_from(["", "Thanks. ", "Hi! ", "One more thing. "]))
def test_key_for_is_stable(rule, existing, prefix):
    """The same rule always maps to the same key, a valid fact key; a rule on the same thing as a
    kept one maps to a kept key; once kept (alone or inside a short turn), a rule maps to the key
    it was kept under."""
    key = key_for(rule, existing)
    assert key == key_for(rule, list(existing))
    assert re.fullmatch(ID_PATTERN, key) and len(key) <= MAX_KEY_CHARS
    if any(same_thing(rule.sentence, value) for _, value in existing):
        assert key in dict(existing)
    kept = [(k, v) for k, v in existing if k != key] + [(key, prefix + rule.sentence)]
    if key not in dict(existing):
        assert key_for(rule, kept) == key
    assert key_for(rule, [(key, prefix + rule.sentence)]) == key
