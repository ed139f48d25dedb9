"""What request handling needs from the replica that runs it, handed in by the deployment shell.

Services hold no Ray: the memorizer is reached through plain callables and metrics through an
observer, so every service function runs (and is tested) without Serve.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from serve_app.core.auth import KeyRing
from serve_app.core.inspector_auth import SessionSigner
from serve_app.core.timings import RecentTimings
from serve_app.encoding import EmbedMany, EmbedOne
from serve_app.llm.client import OpenAIChatClient
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores

CompactNow = Callable[[str, str], Awaitable[dict[str, Any]]]
"""(tenant, session) -> the compaction outcome's public fields, run where the summarizer lives."""
Poke = Callable[[str, str], None]
"""(tenant, session): start memorizing now rather than at the next sweep; fire and forget."""


class Observers(Protocol):
    """Where request metrics go (Prometheus in a replica)."""

    def recall_ms(self, path: str, ms: float) -> None: ...

    def context_sections(self, total_tokens: int, sections: dict[str, int]) -> None: ...

    def chat_call(self, alignment: str, memory_tokens: int, streamed: bool) -> None: ...

    def first_token_s(self, seconds: float) -> None: ...

    def stream_abandoned(self) -> None: ...


class NoObservers:
    def recall_ms(self, path: str, ms: float) -> None:
        pass

    def context_sections(self, total_tokens: int, sections: dict[str, int]) -> None:
        pass

    def chat_call(self, alignment: str, memory_tokens: int, streamed: bool) -> None:
        pass

    def first_token_s(self, seconds: float) -> None:
        pass

    def stream_abandoned(self) -> None:
        pass


@dataclass
class Dependencies:
    settings: Settings
    stores: Stores
    embed_one: EmbedOne
    """A query's vector (recall)."""
    embed_documents: EmbedMany
    """The vectors memories are stored under (the Embedder's document embedding: text and sentences)."""
    compact_now: CompactNow
    keyring: KeyRing = field(default_factory=KeyRing)
    poke: Poke | None = None
    observers: Observers = field(default_factory=NoObservers)
    llm: OpenAIChatClient | None = None
    """The LLM of /v1/chat/completions (None when llm_mode is none)."""
    signer: SessionSigner | None = None
    """Signs inspector sessions (None: sign-in is off, see Settings.ui_secret)."""
    recall_timings: dict[str, RecentTimings] = field(default_factory=dict)
    """This replica's newest recall times per tenant, for /v1/stats (Prometheus has them per replica)."""

    def observe_recall(self, path: str, tenant: str) -> Callable[[float], None]:
        def observe(ms: float) -> None:
            self.observers.recall_ms(path, ms)
            self.recall_timings.setdefault(tenant, RecentTimings()).add(ms)

        return observe
