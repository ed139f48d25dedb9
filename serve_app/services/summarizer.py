"""Summaries for compaction: the LLM when one is configured, the extractive summary otherwise.

Ladder: LLM summary (temperature 0) verified against every key item of what it covers, missing
items pinned; if the LLM fails, the extractive summary, flagged `degraded` so it is redone later.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from serve_app.core.budget import group_blocks
from serve_app.core.compression import SummaryState, extractive_summary
from serve_app.core.tokenizer import count_block, count_tokens
from serve_app.llm.client import ChatCall, ChatClient, LLMError
from serve_app.llm.prompts import pin_missing, summary_messages

logger = logging.getLogger("ray.serve")


@dataclass
class SummaryOutcome:
    state: SummaryState
    text: str
    degraded: bool
    mode: str  # "extractive", "llm" or "fallback"
    pinned: list[str] = field(default_factory=list)
    items_required: int = 0
    items_kept_before_pinning: int = 0
    error: str | None = None


def chunk_span(span: Sequence[dict[str, Any]], max_tokens: int) -> list[list[dict[str, Any]]]:
    """Split a span at block boundaries (a tool call stays with its results) into chunks of ~max_tokens."""
    chunks: list[list[dict[str, Any]]] = [[]]
    used = 0
    for block in group_blocks(span):
        tokens = count_block(block)
        if chunks[-1] and used + tokens > max_tokens:
            chunks.append([])
            used = 0
        chunks[-1].extend(block)
        used += tokens
    return [c for c in chunks if c]


class Summarizer:
    def __init__(
        self,
        client: ChatClient | None,
        *,
        summary_max_tokens: int,
        llm_input_tokens: int = 6000,
        seed: int = 0,
    ):
        self.client = client
        self.summary_max_tokens = summary_max_tokens
        self.llm_input_tokens = llm_input_tokens
        self.seed = seed

    @property
    def uses_llm(self) -> bool:
        return self.client is not None

    def extractive(self, previous: SummaryState, span: Sequence[dict[str, Any]], covers: int) -> tuple[SummaryState, str]:
        return extractive_summary(previous, span, covers, max_tokens=self.summary_max_tokens, count_tokens=count_tokens)

    async def summarize(
        self, previous: SummaryState, previous_text: str, span: Sequence[dict[str, Any]], covers: int
    ) -> SummaryOutcome:
        """New summary = f(previous summary, span); never raises because of the LLM."""
        state, extractive_text = self.extractive(previous, span, covers)
        if self.client is None:
            return SummaryOutcome(state, extractive_text, degraded=False, mode="extractive")
        text = previous_text
        try:
            for chunk in chunk_span(span, self.llm_input_tokens):
                result = await self.client.chat(
                    ChatCall(summary_messages(text, chunk), max_tokens=self.summary_max_tokens, temperature=0.0, seed=self.seed)
                )
                text = result.text.strip()
                if not text:
                    raise LLMError("empty summary")
        except LLMError as exc:
            logger.warning("LLM summary failed, extractive fallback: %s", exc)
            return SummaryOutcome(state, extractive_text, degraded=True, mode="fallback", error=str(exc))
        required = state.key_items  # every key item of everything covered so far, not just this span
        kept_before = sum(1 for item in required if item in text)
        text, pinned = pin_missing(text, required)
        llm_state = SummaryState(state.covers_from_seq, [], state.key_items)
        return SummaryOutcome(llm_state, text, False, "llm", pinned, len(required), kept_before)
