"""OpenAI-compatible chat with memory: the agent's own loop (append, build the prompt, call the model,
append the answer) as one call.

The order keeps every promise of the endpoint: the prompt is built first (a call that cannot fit
the model's window is refused with nothing stored), the tenant's rate limit is spent before the
model is asked, the call's turns are stored before the model answers (its question survives a
failed answer), and the answer is stored whole before the response ends: for a stream, before
`[DONE]`, shielded from the client going away. A stream the client abandons keeps its user turn
and stores no partial answer.

Which turns are new comes from their place against the log's tail (`core.chat_history`); whether a
call repeats an earlier one comes from the client (`services/chat_calls.py`): an `Idempotency-Key`, or the openai
SDK's retry counter. Each new call gets its own id, and its turns and answer get client ids from
it, so two calls at once both keep their answers and a retry stores nothing twice.

The answer is a `Completion` or a `CompletionStream` (the data of each event, in order): what
goes on the wire, and how, is the HTTP router's (`api/routers/chat.py`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from serve_app import schemas
from serve_app.chat_schemas import ChatCompletionRequest, MemoryReport, ModelCard, ModelList
from serve_app.core.auth import Caller
from serve_app.core.chat_history import (
    Alignment,
    Plan,
    fingerprint,
    history_digest,
    last_assistant,
    plan_append,
    turn_id,
)
from serve_app.errors import (
    BudgetError,
    ContextLengthExceeded,
    InvalidRequest,
    ModelRefused,
    ModelUnavailable,
    NoModel,
    ServiceError,
    SessionOwnerError,
    UpstreamFailed,
)
from serve_app.llm.client import LLMError
from serve_app.services import chat_calls
from serve_app.services.chat_conversation import Conversation, conversation
from serve_app.services.context import build_working_memory
from serve_app.services.dependencies import Dependencies
from serve_app.services.quota import check_memory_quota
from serve_app.services.spaces import check_space_quota, granted_owners, require
from serve_app.stores.chat_calls import CallRecord

logger = logging.getLogger("ray.serve")
ANSWER = "answer"
"""The answer's place among a call's turns, for its client id."""
QUERY_CHARS = 8192
"""The recall query is the newest user turn cut to this: a pasted document is answered, not refused."""
DONE = "[DONE]"
"""The data of a stream's last event, as OpenAI ends a stream."""


@dataclass
class Completion:
    """A call answered whole: the OpenAI completion with its `memory` report."""

    body: dict[str, Any]
    memory_headers: dict[str, str]
    """The memory report's session, recalled ids and stored seqs, as X-Memory-* headers."""


@dataclass
class CompletionStream:
    """A streamed call: the data of each event as it comes (a chunk's JSON, an error's JSON, then
    `[DONE]` once the answer is stored; a stream the model broke off ends with its error)."""

    events: AsyncGenerator[str, None]
    memory_headers: dict[str, str]
    """As of the stream's start: the answer's seq is only in the last chunk's `memory`."""


ChatReply = Completion | CompletionStream


def _encodable(request: ChatCompletionRequest) -> None:
    """The request as the model will get it must be UTF-8: a lone surrogate (a JSON "\\ud800" escape
    with no pair) has no UTF-8 form, so it is the client's 422, as on every other route, not a 500
    when the body is sent on."""
    try:
        json.dumps(request.model_dump(mode="json", exclude_unset=True), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        where = f"unpaired surrogate at character {exc.start}"
        raise InvalidRequest(f"text is not valid Unicode: {where}", param="messages") from None


async def _log_tail(deps: Dependencies, tenant: str, talk: Conversation, session: str) -> tuple[list[str], int]:
    """Fingerprints of the session log's tail (as long as the request) and the log's length."""
    meta = await deps.stores.log.meta(tenant, session)
    if meta is not None and meta.user_id != talk.user:
        raise SessionOwnerError(meta.user_id)
    count = meta.message_count if meta else 0
    stored = await deps.stores.log.read(tenant, session, after=max(0, count - len(talk.turns))) if count else []
    return [fingerprint(t) for t in stored], count


async def _place(deps: Dependencies, tenant: str, talk: Conversation) -> tuple[str, Plan, int]:
    """The session of a new call, what of it is new, and the log's length it was planned on.

    Without a session id a conversation is found by the history it resends: the session whose
    log ends with the answer it last got. A first call, or one whose session has moved on (another
    branch of the same opening), opens a session of its own: conversations never merge."""
    if talk.session:
        stored, count = await _log_tail(deps, tenant, talk, talk.session)
        seen = not count and await deps.stores.keywords.has_session(tenant, talk.user, talk.session)
        return talk.session, plan_append(stored, talk.turns, seen_before=seen), count
    last = last_assistant(talk.turns)
    if last >= 0:
        digest = history_digest(tenant, talk.user, talk.system_prompt or "", talk.turns[: last + 1])
        known = await deps.stores.chats.conversation(tenant, talk.user, digest)
        if known:
            stored, count = await _log_tail(deps, tenant, talk, known)
            plan = plan_append(stored, talk.turns, seen_before=False)
            if plan.alignment is Alignment.CONTINUES and len(plan.new) == len(talk.turns) - last - 1:
                return known, plan, count
    return "chat-" + uuid.uuid4().hex[:24], Plan(Alignment.NEW, list(talk.turns)), 0


def _message_in(turn: dict[str, Any], message_id: str) -> schemas.MessageIn:
    try:
        return schemas.MessageIn(**turn, id=message_id)
    except ValidationError as exc:
        raise InvalidRequest(exc.errors(include_url=False, include_context=False), param="messages") from None


def _storable(text: str) -> str:
    """The model's text as every store keeps it: NUL and unpaired surrogates cannot be stored, and the
    answer was given, so they go rather than the answer."""
    return text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")


def _answer(content: str | None, tool_calls: list[Any] | None) -> dict[str, Any]:
    """The model's answer as a turn: what the client gets, and (storable) what the log keeps."""
    turn: dict[str, Any] = {"role": "assistant", "content": _storable(content or "")}
    calls = [c.model_dump() if hasattr(c, "model_dump") else c for c in tool_calls or []]
    if calls:
        turn["tool_calls"] = [
            {
                "id": c.get("id"),
                "type": "function",
                "function": {key: _storable(str(c["function"][key] or "")) for key in ("name", "arguments")},
            }
            for c in calls
        ]
    return turn


async def _store(
    deps: Dependencies, tenant: str, talk: Conversation, session: str, turns: Sequence[dict[str, Any]], ids: list[str]
) -> tuple[list[int], list[bool]]:
    """Append turns the call already validated, spent for and checked against the quota: the
    model's answer is never refused after the fact."""
    if not turns:
        return [], []
    now = datetime.now(UTC).isoformat()
    written_into = {"space": talk.write_space} if talk.write_space else {}
    messages = [
        {**turn, "id": ident, "created_at": turn.get("created_at") or now, **written_into}
        for turn, ident in zip(turns, ids, strict=True)
    ]
    result = await deps.stores.log.append(tenant, session, talk.user, messages)
    if deps.poke is not None and not all(result.duplicates):
        deps.poke(tenant, session)
    return result.seqs, result.duplicates


_KEY_LIKE = re.compile(r"\bsk-[A-Za-z0-9*._-]{4,}")
"""What an OpenAI-style key (or its masked echo) looks like in a provider's message."""


def _model_error(deps: Dependencies, exc: LLMError) -> ServiceError:
    """What a failure of the model endpoint answers: the tenant's 400 only when the model refused
    what the request asked (a parameter it does not take); the service's 502 or 503 otherwise,
    naming the endpoint and never its credentials."""
    upstream = urlsplit(deps.settings.llm_base_url).hostname or "the model endpoint"
    status = exc.status_code
    if status is None:
        return ModelUnavailable(f"{upstream}: {type(exc.__cause__).__name__ if exc.__cause__ else 'no answer'}")
    if status in (408, 429, 503):
        retry = exc.retry_after if exc.retry_after and exc.retry_after.isdigit() else None
        return ModelUnavailable(f"{upstream} answered HTTP {status}", retry_after_s=int(retry) if retry else 2)
    if status in (400, 413, 422):
        body = exc.body if isinstance(exc.body, dict) else {}
        message = str(body.get("message") or exc)
        key = deps.settings.llm_api_key
        message = _KEY_LIKE.sub("[redacted]", message.replace(key, "[redacted]") if key else message)
        return ModelRefused(f"the model refused the request: {message}")
    return UpstreamFailed(f"the model endpoint {upstream} failed the request (HTTP {status}); the service's operator is told")


def _spend(deps: Dependencies, caller: Caller, amount: int):
    settings = deps.settings
    limit = settings.rate_limit_overrides.get(caller.tenant, settings.rate_limit_messages_per_minute)
    return deps.stores.rate_limits.spend(caller.key_digest, amount, limit)


@dataclass
class _Call:
    """One call as it is carried out: new, or the retry of a call already taken."""

    id: str
    session: str
    alignment: Alignment
    new: list[dict[str, Any]]
    history_upto: int
    record: CallRecord | None = None
    """The record of the call this one retries."""

    def ids(self) -> list[str]:
        return [turn_id(self.id, i) for i in range(len(self.new))]


async def _resolve(deps: Dependencies, tenant: str, talk: Conversation, retry: chat_calls.RetryKey | None) -> _Call:
    record = await chat_calls.earlier_call(deps, tenant, talk.user, retry)
    if record is None:
        session, plan, count = await _place(deps, tenant, talk)
        return _Call(uuid.uuid4().hex, session, plan.alignment, plan.new, count)
    new = talk.turns[len(talk.turns) - record.new_turns :] if record.new_turns else []
    call = _Call(record.call, record.session, Alignment.RETRIED, new, 0, record)
    first = (await deps.stores.log.seqs_of(tenant, call.session, call.ids()[:1]))[:1]
    if first and first[0] is not None:
        call.history_upto = first[0] - 1
    else:
        meta = await deps.stores.log.meta(tenant, call.session)
        call.history_upto = meta.message_count if meta else 0
    return call


async def chat_completion(
    deps: Dependencies, caller: Caller, request: ChatCompletionRequest, headers: dict[str, str]
) -> ChatReply:
    """Answer one chat call from working memory, storing its new turns and its answer."""
    if deps.llm is None:
        raise NoModel()
    started = time.perf_counter()
    llm, tenant = deps.llm, caller.tenant
    talk = conversation(deps, request, headers)
    _encodable(request)
    shared = await granted_owners(deps, caller, talk.spaces)
    if talk.write_space is not None:
        await require(deps, caller, talk.write_space, "write")
        await check_space_quota(deps, tenant, talk.write_space, len(talk.turns) + 1)
    store = request.store is not False
    retry = chat_calls.retry_key(request, talk, headers) if store else None
    call = await _resolve(deps, tenant, talk, retry)
    answer_id = turn_id(call.id, ANSWER)
    if call.record is not None:
        seq = (await deps.stores.log.seqs_of(tenant, call.session, [answer_id]))[0]
        if seq is not None:  # answered already: the same answer again, the model not asked
            await _spend(deps, caller, 1)
            return await _replay(deps, tenant, talk, call, seq, request.stream)
    window = await llm.context_window(deps.settings.llm_context_window)
    reserve = request.max_completion_tokens or request.max_tokens or deps.settings.chat_max_completion_tokens
    if reserve >= window:
        raise ContextLengthExceeded(f"this model's context window is {window} tokens; the answer alone asks for {reserve}")
    now = datetime.now(UTC)
    new_turns = [_message_in(t, i).stored(now) for t, i in zip(call.new, call.ids(), strict=True)] if store else []
    try:
        context = await build_working_memory(
            deps,
            tenant,
            schemas.ContextRequestIn.model_construct(
                user_id=talk.user,
                session_id=call.session,
                query=next((t["content"] for t in reversed(talk.turns) if t["role"] == "user"), "")[:QUERY_CHARS],
                system_prompt=talk.system_prompt,
                max_tokens=window,
                reserve_output=reserve,
            ),
            pending_turns=call.new,
            tools=request.tools or [],
            history_upto=call.history_upto,
            shared=shared,
        )
    except BudgetError as exc:
        raise ContextLengthExceeded(
            f"this model's context window is {window} tokens; the system prompt, tools, newest turn and "
            f"{reserve} tokens of answer do not fit ({exc.detail})"
        ) from None
    await _spend(deps, caller, len(call.new) + 1 if store else 1)
    stored: list[int] = []
    if store:
        await check_memory_quota(deps, tenant, len(call.new) + 1)
        if retry is not None and call.record is None:
            record = CallRecord(call.id, call.session, retry.body, len(call.new))
            await chat_calls.remember(deps, tenant, talk.user, retry, record)
        stored, _ = await _store(deps, tenant, talk, call.session, new_turns, call.ids())
    report = MemoryReport(
        session_id=call.session,
        user_id=talk.user,
        stored_seqs=stored,
        recalled=[hit.id for hit in context.recalled],
        alignment=call.alignment.value,
        memory_tokens=context.usage.sections["memory"].tokens,
        prompt_tokens=context.usage.total_tokens,
    )
    deps.observers.chat_call(call.alignment.value, report.memory_tokens, request.stream)
    if call.alignment in (Alignment.DIVERGED, Alignment.EXPIRED):
        logger.info("chat history %s from the log of %s/%s", call.alignment.value, tenant, call.session)
    body = request.passthrough() | {"messages": context.messages, "max_tokens": reserve}
    keeper = _Keeper(deps, tenant, talk, call, answer_id) if store else None
    if request.stream:
        chunks = llm.stream(body)
        try:
            first = await anext(chunks)  # a model that is down answers with a status, not a broken stream
        except LLMError as exc:
            raise _model_error(deps, exc) from exc
        except StopAsyncIteration:
            first = None
        return CompletionStream(_stream(deps, first, chunks, report, keeper, started), _memory_headers(report))
    try:
        completion = await llm.complete(body)
    except LLMError as exc:
        raise _model_error(deps, exc) from exc
    out = completion.model_dump(exclude_unset=True)
    message = completion.choices[0].message if completion.choices else None
    if keeper is not None and message is not None:
        turn, seq = await keeper.keep(_answer(message.content, message.tool_calls))
        report.stored_seqs.append(seq)
        out["choices"][0]["message"] = {**out["choices"][0]["message"], **turn}
    out["memory"] = report.model_dump()
    return Completion(out, _memory_headers(report))


def _memory_headers(report: MemoryReport) -> dict[str, str]:
    return {
        "X-Memory-Session-Id": report.session_id,
        "X-Memory-Recalled": ",".join(report.recalled),
        "X-Memory-Stored-Seqs": ",".join(map(str, report.stored_seqs)),
    }


class _Keeper:
    """Stores a call's answer, once, and names its conversation for a client that sends no
    session id."""

    def __init__(self, deps: Dependencies, tenant: str, talk: Conversation, call: _Call, answer_id: str):
        self.deps, self.tenant, self.talk, self.call, self.answer_id = deps, tenant, talk, call, answer_id

    async def keep(self, turn: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """The answer as stored, and its seq. A retry racing its first attempt may find the first
        attempt's answer stored: that one is the call's answer, and is what the client gets."""
        deps, tenant, talk, call = self.deps, self.tenant, self.talk, self.call
        (seq,), (duplicate,) = await _store(deps, tenant, talk, call.session, [turn], [self.answer_id])
        if duplicate:
            turn = _public((await deps.stores.log.read(tenant, call.session, after=seq - 1, limit=1))[0])
        if not talk.session:
            digest = history_digest(tenant, talk.user, talk.system_prompt or "", [*talk.turns, turn])
            await deps.stores.chats.remember_conversation(tenant, talk.user, digest, call.session, deps.settings.session_ttl_s)
        return turn, seq


def _public(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored answer as the model's message: role, content, tool calls."""
    turn = {"role": "assistant", "content": stored.get("content") or ""}
    if stored.get("tool_calls"):
        turn["tool_calls"] = stored["tool_calls"]
    return turn


async def _replay(deps: Dependencies, tenant: str, talk: Conversation, call: _Call, answer_seq: int, stream: bool) -> ChatReply:
    """The stored answer of a call retried after it was answered, as a completion or a stream."""
    turn = _public((await deps.stores.log.read(tenant, call.session, after=answer_seq - 1, limit=1))[0])
    seqs = [s for s in await deps.stores.log.seqs_of(tenant, call.session, call.ids()) if s is not None]
    report = MemoryReport(
        session_id=call.session, user_id=talk.user, stored_seqs=[*seqs, answer_seq], recalled=[],
        alignment=Alignment.RETRIED.value, memory_tokens=0, prompt_tokens=0,
    )  # fmt: skip
    deps.observers.chat_call(Alignment.RETRIED.value, 0, stream)
    head = {"id": f"chatcmpl-{call.id}", "created": int(time.time()), "model": deps.settings.llm_model}
    finish = "tool_calls" if turn.get("tool_calls") else "stop"
    if not stream:
        choice = {"index": 0, "message": turn, "finish_reason": finish}
        out = head | {"object": "chat.completion", "choices": [choice], "memory": report.model_dump()}
        return Completion(out, _memory_headers(report))

    async def events() -> AsyncGenerator[str, None]:
        chunk = head | {"object": "chat.completion.chunk"}
        yield json.dumps(chunk | {"choices": [{"index": 0, "delta": turn, "finish_reason": None}]})
        yield json.dumps(chunk | {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        yield json.dumps(chunk | {"choices": [], "memory": report.model_dump()})
        yield DONE

    return CompletionStream(events(), _memory_headers(report))


class _Answer:
    """The answer as its chunks arrive: text and tool calls by index."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}

    def add(self, delta: Any) -> bool:
        """Take a chunk's delta; True when it carried output (for the time to the first token)."""
        if delta is None:
            return False
        out = False
        if delta.content:
            self.text.append(delta.content)
            out = True
        for call in delta.tool_calls or []:
            slot = self.calls.setdefault(call.index, {"id": None, "function": {"name": "", "arguments": ""}})
            slot["id"] = call.id or slot["id"]
            if call.function is not None:
                slot["function"]["name"] += call.function.name or ""
                slot["function"]["arguments"] += call.function.arguments or ""
            out = True
        return out

    def turn(self) -> dict[str, Any]:
        return _answer("".join(self.text), [self.calls[i] for i in sorted(self.calls)])


async def _stream(
    deps: Dependencies,
    first: Any,
    rest: AsyncIterator[Any],
    report: MemoryReport,
    keeper: _Keeper | None,
    started: float,
) -> AsyncGenerator[str, None]:
    """Each chunk as the model gives it; then the answer stored, the memory report, [DONE]."""
    answer = _Answer()
    waiting_for_output = True
    last: Any = None
    ended = False

    async def chunks() -> AsyncIterator[Any]:
        if first is not None:
            yield first
        async for chunk in rest:
            yield chunk

    try:
        try:
            async for chunk in chunks():
                last = chunk
                if any(answer.add(choice.delta) for choice in chunk.choices) and waiting_for_output:
                    waiting_for_output = False
                    deps.observers.first_token_s(time.perf_counter() - started)
                yield chunk.model_dump_json(exclude_unset=True)
        except LLMError as exc:  # the model broke off: no partial answer is stored
            ended = True
            error = {"message": str(_model_error(deps, exc)), "type": "server_error", "param": None, "code": None}
            yield json.dumps({"error": error})
            return
        ended = True
        if keeper is not None:
            # Stored before [DONE], and shielded: a client that leaves now does not cut the write.
            stored = asyncio.ensure_future(keeper.keep(answer.turn()))
            report.stored_seqs.append((await asyncio.shield(stored))[1])
        tail = {"id": getattr(last, "id", ""), "object": "chat.completion.chunk", "created": getattr(last, "created", 0)}
        tail |= {"model": getattr(last, "model", ""), "choices": [], "memory": report.model_dump()}
        yield json.dumps(tail)
        yield DONE
    finally:
        if not ended:
            deps.observers.stream_abandoned()


async def models(deps: Dependencies) -> ModelList:
    """The one model this service answers with (none without an LLM)."""
    if deps.llm is None:
        return ModelList(data=[])
    window = await deps.llm.context_window(deps.settings.llm_context_window)
    return ModelList(data=[ModelCard(id=deps.settings.llm_model, context_window=window)])
