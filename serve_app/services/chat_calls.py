"""Whether a chat call repeats one the service already took: the client says so, the words never do.

An `Idempotency-Key` header names one call (sent again with another body it is refused); the
openai SDK marks its own retries with `x-stainless-retry-count` (0 on the first attempt, the same
body each time). A call that carries either is remembered (`stores/chat_calls.py`) before its turns
are stored, so its retry finds it at any point and stores nothing twice. A call that carries
neither is a new call, whatever its words.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from serve_app.chat_schemas import ChatCompletionRequest
from serve_app.errors import Conflict, InvalidRequest
from serve_app.services.dependencies import Dependencies
from serve_app.stores.chat_calls import CallRecord

if TYPE_CHECKING:
    from serve_app.services.chat_conversation import Conversation

MAX_KEY_CHARS = 255


@dataclass(frozen=True)
class RetryKey:
    key: str
    """Where the call is remembered: the Idempotency-Key's digest, or the request's."""
    body: str
    """The request's digest: who asks, in which session, with which body."""
    first_only: bool
    """An Idempotency-Key: the first call of the key is the one, and another body is refused."""
    retry: bool
    """The request may repeat a remembered call (a key, or the SDK's counter at 1 or more)."""


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode("utf-8", "backslashreplace")).hexdigest()[:40]


def retry_key(request: ChatCompletionRequest, talk: Conversation, headers: dict[str, str]) -> RetryKey | None:
    """The key a retry of this request would be known by; None: the client marks no retries."""
    idempotency, counter = headers.get("idempotency-key"), headers.get("x-stainless-retry-count")
    if idempotency is None and counter is None:
        return None
    # Streamed or not, the answer is the same: a retry may ask for it either way.
    sent = request.model_dump(mode="json", exclude_unset=True, exclude={"stream", "stream_options"})
    body = _digest(talk.user, talk.session or "", json.dumps(sent, sort_keys=True))
    if idempotency is not None:
        if not 1 <= len(idempotency) <= MAX_KEY_CHARS:
            raise InvalidRequest(f"Idempotency-Key must be 1 to {MAX_KEY_CHARS} characters", param="Idempotency-Key")
        return RetryKey("key:" + _digest(idempotency), body, first_only=True, retry=True)
    return RetryKey("sdk:" + body, body, first_only=False, retry=counter.strip() not in ("", "0"))


async def earlier_call(deps: Dependencies, tenant: str, user: str, retry: RetryKey | None) -> CallRecord | None:
    """The call this request repeats, if the client says it repeats one and it was taken."""
    if retry is None or not retry.retry:
        return None
    record = await deps.stores.chats.find(tenant, user, retry.key)
    if record is not None and retry.first_only and record.body != retry.body:
        raise InvalidRequest("this Idempotency-Key was used with another request body", param="Idempotency-Key")
    return record


async def remember(deps: Dependencies, tenant: str, user: str, retry: RetryKey, record: CallRecord) -> None:
    """Keep a new call for its retries, before any of its turns is stored."""
    earlier = await deps.stores.chats.claim(tenant, user, retry.key, record, first_only=retry.first_only)
    if earlier is not None:  # another request with the same Idempotency-Key got there first
        raise Conflict("a request with this Idempotency-Key is in progress; retry it shortly", retry_after_s=1)
