"""Is a long message's evidence in a prompt? Pure text matching, no I/O.

A prompt may quote a long message in part (a passage, or the message cut at a length), so a source
message counts two ways: **any passage** of it is quoted (a span of `SPAN` contiguous characters no
other message of the conversation holds, or the whole text when shorter), and its **answer
passage** is quoted (of the message split into about 600-character passages on sentence
boundaries, the one sharing most words with the reference answer: its text, or at least
`PASSAGE_SHARE` of its characters in quoted spans). Text is compared whitespace- and
case-normalised. Summary memories (a block of a session's turns, each by its first sentence) are
taken out of the prompt first: their lines quote the start of many messages, and a line is not the
evidence a question needs.
"""

from __future__ import annotations

import re

from serve_app.core.stop_words import ENGLISH_STOP_WORDS

SPAN = 80
PASSAGE_CHARS = 600
PASSAGE_SHARE = 0.8
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_WORD = re.compile(r"\w+")
_SUMMARY_BULLET = re.compile(r"\n- Summary of turns? [\d-]+ of a session:(?:\n  [^\n]*)*")


def without_summaries(prompt: str) -> str:
    """The prompt less its summary memories' bullets (core/session_summaries.py writes them)."""
    return _SUMMARY_BULLET.sub("", prompt)


def normalized(text: str) -> str:
    return " ".join(text.split()).lower()


class Corpus:
    """Every message of a conversation, normalised: which spans only one of them holds."""

    def __init__(self, texts: list[str]):
        self.text = "\x00".join(normalized(t) for t in texts)

    def unique(self, span: str) -> bool:
        first = self.text.find(span)
        return first >= 0 and self.text.find(span, first + 1) < 0


class PromptText:
    """A prompt's normalised text and every `SPAN`-character window of it, so that each window of a
    message is one set lookup (messages run to thousands of characters, prompts to tens of thousands)."""

    def __init__(self, text: str, span: int = SPAN):
        self.text = normalized(text)
        self.span = span
        self.windows = {self.text[i : i + span] for i in range(max(0, len(self.text) - span + 1))}

    def covered(self, text: str) -> float:
        """The share of `text`'s (normalised) characters inside windows the prompt quotes; a text
        shorter than a window counts whole or not at all."""
        text = normalized(text)
        if not text:
            return 0.0
        if len(text) <= self.span:
            return float(text in self.text)
        marks = [0] * (len(text) + 1)
        for i in range(len(text) - self.span + 1):
            if text[i : i + self.span] in self.windows:
                marks[i] += 1
                marks[i + self.span] -= 1
        inside, depth = 0, 0
        for mark in marks[:-1]:
            depth += mark
            inside += depth > 0
        return inside / len(text)

    def quotes_any(self, text: str, corpus: Corpus | None = None) -> bool:
        """Some window of the text (or all of a short text) is in the prompt; with a corpus, a window
        that `corpus` holds more than once does not count (code pasted into many turns of a
        conversation would make every one of them look quoted)."""
        text = normalized(text)
        if len(text) <= self.span:
            return bool(text) and text in self.text
        for i in range(len(text) - self.span + 1):
            window = text[i : i + self.span]
            if window in self.windows and (corpus is None or corpus.unique(window)):
                return True
        return False

    def quotes_passage(self, passage: str) -> bool:
        return normalized(passage) in self.text or self.covered(passage) >= PASSAGE_SHARE


def passages(text: str, size: int = PASSAGE_CHARS) -> list[str]:
    """The text in passages of about `size` characters that end at sentence or line ends; a
    sentence longer than `size` (a code block without full stops) is cut at `size`."""
    pieces = [p for s in _SENTENCE_END.split(text) if (p := s.strip())]
    out: list[str] = []
    current = ""
    for piece in pieces:
        if current and len(current) + 1 + len(piece) > size:
            out.append(current)
            current = ""
        while len(piece) > size:
            out.append(piece[:size])
            piece = piece[size:]
        current = f"{current} {piece}" if current else piece
    if current:
        out.append(current)
    return out


def content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in ENGLISH_STOP_WORDS}


def answer_passage(text: str, answer: str) -> tuple[int, str]:
    """The passage of `text` sharing most content words with the answer (the first on a tie), and
    its index: where in the message the evidence sits."""
    chunks = passages(text) or [text]
    wanted = content_words(answer)
    best = max(range(len(chunks)), key=lambda i: (len(wanted & content_words(chunks[i])), -i))
    return best, chunks[best]
