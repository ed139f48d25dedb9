"""Standing instructions and preferences: what a user says that holds from then on. Pure: no I/O.

Without an LLM the memorizer finds them with the rules below and keeps each as a fact (category
`instruction` or `preference`), so that a later rule on the same thing supersedes it and the facts
history shows both. The context builder puts the ones that bear on a request in a section of
their own, even when the request's words do not match them.

Two rules are *on the same thing* when the Jaccard similarity of their topic words is at least
`SAME_THING` (0.5). Topic words are the rule's stemmed content words: stop words out, and the words
that only make it a rule ("always", "please", "prefer", "love"...) out too, so that "I love jazz"
and "I hate jazz" are on the same thing (jazz), and so are "Always use metric units" and "Always
use imperial units" (two shared words of four). A "my favourite X is Y" rule is about X alone.
Short rules that differ in their one word of substance ("Reply in French", "Reply in German") are
not: both are kept, and the prompt shows them dated, newest first.

The rules are conservative: a question is never a rule, nor a one-off request ("this time",
"today", "Please keep it short"), and "I always ..." about a habit is a preference at most.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from serve_app.core.keywords import terms
from serve_app.core.sentences import sentences

RuleKind = Literal["instruction", "preference"]
STANDING_CATEGORIES: tuple[RuleKind, ...] = ("instruction", "preference")
SAME_THING = 0.5
"""Least Jaccard similarity of two rules' topic words for them to be on the same thing."""
MAX_RULE_CHARS = 300
"""A longer sentence is not taken for a rule: a standing rule is said in a sentence, not a paragraph."""
WHOLE_TURN_CHARS = 300
"""A turn this short that holds one rule is kept whole as the rule's value."""
MAX_KEY_CHARS = 48
KEY_WORDS = 5
"""Topic words a new key is made of at most."""


@dataclass(frozen=True)
class Rule:
    """One sentence of a user turn that holds from then on."""

    sentence: str
    kind: RuleKind


_MARKER = re.compile(
    r"\b(?:always|never|from now on|from here on|going forward|moving forward|in (?:the )?future|every time|each time|"
    r"whenever|any ?time|by default|at all times|no matter what|(?:don't|do not) ever|henceforth|for all future)\b"
)
"""Words that make an imperative hold from then on."""
_DISCOURSE = (
    r"(?:(?:and|but|so|then|also|just|please|kindly|ok|okay|oh|actually|honestly|personally|generally|btw|fyi|"
    r"by the way|in general|from now on|from here on(?: out)?|going forward|moving forward|in (?:the )?future|"
    r"by default|henceforth|(?:remember|note|keep in mind|just so you know)(?: that)?)\s+)*"
)
_VERBS = (
    r"use|format|write|reply|respond|answer|keep|avoid|stop|start|end|begin|include|add|put|give|show|list|sign|spell|"
    r"speak|talk|explain|summari[sz]e|translate|convert|mention|skip|omit|limit|send|copy|cc|check|double-check|ask|"
    r"remind|tell|assume|treat|stay|stick|cite|quote|round|measure|express|present|structure|refer|address|call|be|"
    r"make sure|remember|let me know|only|don't|do not|prefer|try|follow|leave|sort|order|"
    r"(?:always|never)(?! (?:mind|again|the|a|an|so|too|ever|before|once|been)\b| \w+ed\b)"
)
_IMPERATIVE = re.compile(rf"^{_DISCOURSE}(?:{_VERBS})\b")
_ADDRESSED = re.compile(
    r"\b(?:you should|you must|you need to|you have to|you will|you'll|(?:want|like|need) you to|"
    r"could you|can you|would you|will you)\b"
)
_INHERENTLY_STANDING = re.compile(
    rf"^{_DISCOURSE}(?:make sure (?:to|you)|be sure to|remember to|call me|address me|refer to me|"
    r"(?:please|kindly) (?:use|format|avoid|keep|stop|don't|do not|always|never|reply|respond|answer|"
    r"call me|address me|refer to me))\b"
)
"""Forms that hold from then on without a marker: "Call me Sam.", "Please use British spelling."."""
_PRONOUN_OBJECT = re.compile(
    r"^(?:\w+ ){0,3}?(?:use|format|keep|write|send|reply to|answer|make sure|remember|call|check) "
    r"(?:it|this|that|these|those|them)\b"
)
"""A request about something at hand ("Please keep it short") is a one-off."""
_ONE_OFF = re.compile(
    r"\b(?:this time|this once|just once|for now|right now|today|tonight|tomorrow|yesterday|"
    r"this (?:one|email|e-mail|message|document|file|answer|reply|letter|week|month|weekend|morning|evening))\b|^now\b"
)
_HABIT_PAST = re.compile(
    r"^(?:\w+ed|said|told|did|got|was|were|had|knew|thought|meant|went|saw|made|took|gave|came|ate|drank|heard|"
    r"forgot|felt|found|left|lost|paid|sent|spent|bought|brought|won|wrote)\b"
)
_PREFERENCE = re.compile(
    rf"^{_DISCOURSE}(?:"
    r"i (?:(?:really|truly|absolutely|just|also|generally|usually|much|strongly|definitely) )*"
    r"(?P<taste>prefer|like|love|enjoy|adore|hate|dislike|detest|loathe)\b(?P<object>.*)"
    r"|i(?:'d| would) (?:much |really |definitely )?(?:prefer|rather)\b"
    r"|i (?:can't|cannot|can not) stand\b"
    r"|i (?:don't|do not|never|can't|cannot|won't) (?:really )?(?:like|eat|drink|enjoy|want)\b"
    r"|i (?:always|never|usually|normally|generally) (?P<habit>.*)"
    r"|i(?:'m| am) (?:(?:very|severely|mildly|a|an|strictly|big|huge) )*(?:allergic|intolerant|vegetarian|vegan|"
    r"pescatarian|lactose|gluten|diabetic|kosher|halal|teetotal|coeliac|celiac|fan of|not a fan of)\b"
    r"|my (?:all-time )?(?:favou?rite|preferred) [\w' -]{1,40}? (?:is|are)\b"
    r")"
)
_TASTE_ON_THE_THING_AT_HAND = re.compile(r"^\s+(?:it|that|this|these|those|them|you|your|yours|him|her)\b(?! when)")
_FAVOURITE = re.compile(r"\bmy (?:all-time )?(?:favou?rite|preferred) (?P<subject>[\w' -]{1,40}?) (?:is|are)\b", re.IGNORECASE)
_CLAUSE = re.compile(r"\s*(?:[,;:]|\s[-\u2013\u2014]\s|\b(?:and|but|because|so)\b)\s*")
_CONDITIONAL = re.compile(
    r"\b(?:when|whenever|if|about|while|for(?! (?:everything|anything|all|every|any|me|good)\b))\b"
    r"(?! you (?:answer|reply|respond|write|talk|speak)(?: to me)?\s*(?:,|$))"
)
"""A clause that limits a rule to some requests ("for recipes", "when I ask about code")."""

_RULE_WORDS = (
    "always never ever please kindly make sure remember prefer preferred like love enjoy adore hate dislike detest "
    "loathe rather favourite favorite going forward moving future default time times now stand fan really just want "
    "instead usually normally generally truly absolutely definitely strongly much don doesn didn won can cannot"
)
_RULE_STEMS = frozenset(terms(_RULE_WORDS))
_KEY_SAFE = re.compile(r"[^a-z0-9]")


def _plain(text: str) -> str:
    return " ".join(text.replace("\u2019", "'").replace("\u2018", "'").lower().split())


def _clauses(sentence: str) -> list[str]:
    return [c for c in _CLAUSE.split(_plain(sentence)) if c]


_LEADS_IN = re.compile(
    r"^(?:when|whenever|if|for|about|while|unless|before|after|every time|each time|any ?time|from now on|from here on|"
    r"going forward|moving forward|in (?:the )?future|by default|henceforth|always|never|please|and|also|ok|okay|thanks|"
    r"thank you)\b"
)


def _may_command(before: str) -> bool:
    """Whether a clause after `before` can be a command: the first clause, or one after a condition,
    a marker or a word or two ("Thanks, always ..."); not after a statement ("Rex eats fish, never
    chicken")."""
    return not before or len(before.split()) <= 2 or bool(_LEADS_IN.match(before))


def _kind(sentence: str) -> RuleKind | None:
    """What the sentence is as a rule, or None when it is none."""
    plain = _plain(sentence).strip(" \"'()[]")
    if not plain or plain.endswith("?") or len(sentence) > MAX_RULE_CHARS or _ONE_OFF.search(plain):
        return None
    clauses = _clauses(plain)
    marker = bool(_MARKER.search(plain))
    for before, clause in zip(["", *clauses], clauses, strict=False):
        if not _may_command(before):
            continue
        if _INHERENTLY_STANDING.match(clause) and not _PRONOUN_OBJECT.match(clause):
            return "instruction"
        if marker and (_IMPERATIVE.match(clause) or _ADDRESSED.search(clause)) and not clause.startswith("i "):
            return "instruction"
    for clause in clauses:
        if marker and _ADDRESSED.search(clause):
            return "instruction"
        found = _PREFERENCE.match(clause)
        if found is None:
            continue
        if found.group("taste") and _TASTE_ON_THE_THING_AT_HAND.match(found.group("object") or ""):
            continue
        habit = found.group("habit")
        if habit is not None and (not habit or _HABIT_PAST.match(habit)):
            continue
        return "preference"
    return None


def _content(text: str) -> list[str]:
    """Stemmed content words: stop words and rule words out, each once, in order."""
    return list(_cached_content(text) if len(text) <= CACHED_TEXT_CHARS else _content_of(text))


CACHED_TEXT_CHARS = 2048
"""A context matches every standing rule of the user to its query: a rule's words are kept."""


@lru_cache(maxsize=4096)
def _cached_content(text: str) -> tuple[str, ...]:
    return _content_of(text)


def _content_of(text: str) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for term in terms(text):
        term = _KEY_SAFE.sub("", term)
        if (len(term) > 1 or term.isdigit()) and term not in _RULE_STEMS:
            seen.setdefault(term)
    return tuple(seen)


def _about(sentence: str) -> str:
    favourite = _FAVOURITE.search(sentence.replace("\u2019", "'"))
    return favourite.group("subject") if favourite else sentence


def topic_words(sentence: str) -> list[str]:
    """What a rule is about: its content words, or the X of "my favourite X is Y"."""
    return _content(_about(sentence))


def _key_words(sentence: str) -> list[str]:
    """The topic words as written (lowercase, unstemmed): a key people read."""
    seen: dict[str, None] = {}
    for word in re.findall(r"\w+", _about(sentence).lower()):
        word = _KEY_SAFE.sub("", word)
        if word and _content(word):
            seen.setdefault(word)
    return list(seen)


def standing_rules(text: str) -> list[Rule]:
    """The sentences of a user turn that hold from then on, in order; of two on the same thing in
    one turn, the later (it is what the user settled on)."""
    rules: list[Rule] = []
    for sentence in sentences(text):
        kind = _kind(sentence)
        if kind is None or not topic_words(sentence):
            continue
        rules = [r for r in rules if not same_thing(r.sentence, sentence)]
        rules.append(Rule(sentence, kind))
    return rules


def _jaccard(a: Collection[str], b: Collection[str]) -> float:
    first, second = set(a), set(b)
    if not first or not second:
        return 0.0
    return len(first & second) / len(first | second)


def same_thing(a: str, b: str) -> bool:
    """Whether two rules are on the same thing: Jaccard of their topic words at least SAME_THING."""
    return _jaccard(topic_words(a), topic_words(b)) >= SAME_THING


def _similarity(sentence: str, value: str) -> float:
    """How close a rule is to a stored value: to the closest rule the value holds (a stored value is
    often the whole short turn the rule was said in), or to the value itself when it holds none."""
    topic = topic_words(sentence)
    said = [r.sentence for r in standing_rules(value)] or [value]
    return max(_jaccard(topic, topic_words(s)) for s in said)


def key_for(rule: Rule, existing: Sequence[tuple[str, str]], taken: Collection[str] = ()) -> str:
    """The key of the existing instruction or preference (key, value) on the same thing as `rule`
    (the closest, the first of equals), else a new key made of the rule's first topic words; a new
    key that another fact already holds (`taken`, `existing`) gets a digest of the topic."""
    best, best_key = SAME_THING, None
    for key, value in existing:
        score = _similarity(rule.sentence, value)
        if score >= best and (best_key is None or score > best):
            best, best_key = score, key
    if best_key is not None:
        return best_key
    words = topic_words(rule.sentence)
    key = f"{rule.kind}." + "-".join(_key_words(rule.sentence)[:KEY_WORDS])
    key = key[:MAX_KEY_CHARS].rstrip("-")
    if key in taken or any(key == k for k, _ in existing):
        digest = hashlib.sha256(" ".join(sorted(words)).encode()).hexdigest()[:8]
        key = f"{key[: MAX_KEY_CHARS - 9].rstrip('-')}-{digest}"
    return key


def rule_value(turn: str, rules: Sequence[Rule], rule: Rule) -> str:
    """What a rule is kept as: the whole turn when it is short and holds this one rule (the words
    around a rule often say what it is for), else the rule's sentence."""
    whole = turn.strip()
    return whole if len(rules) == 1 and len(whole) <= WHOLE_TURN_CHARS else rule.sentence


def key_words(key: str) -> str:
    """The words of a fact's key, without the kind a detected rule's key starts with: an LLM's key,
    `favorite_language`, names what a short value, `Go`, is about."""
    name = key.split(".", 1)[1] if key.startswith(tuple(f"{k}." for k in STANDING_CATEGORIES)) else key
    return re.sub(r"[_.@-]+", " ", name)


def bears_on(rule_value: str, kind: str, query: str, about: str = "") -> bool:
    """Whether a rule belongs in the prompt of a request: an instruction without a condition always
    does; a conditional one and a preference when the request shares a content word with it (or
    with `about`, the words of the key it is kept under)."""
    if kind == "instruction" and not _CONDITIONAL.search(_plain(rule_value)):
        return True
    words = set(_content(rule_value)) | set(_content(about))
    return bool(words & set(_content(query)))
