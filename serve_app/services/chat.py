"""OpenAI-compatible chat with memory: the agent's own loop (append, build the prompt, call the model,
append the answer) as one call.

The request's turns that the session log lacks are appended (`core.chat_history` decides which),
the prompt is the service's working memory for the model's window minus the answer's tokens, the
model is the one the service already uses, and its answer is appended before the response ends:
for a stream, before `[DONE]`, shielded from the client going away. A stream the client abandons
keeps its user turn and stores no partial answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from serve_app import schemas
from serve_app.chat_schemas import ChatCompletionRequest, MemoryReport, ModelCard, ModelList
from serve_app.core.auth import Caller
from serve_app.core.chat_history import Alignment, Plan, derived_session_id, fingerprint, plan_append, turn_id
from serve_app.core.ids import validate_id
from serve_app.errors import InvalidRequest, ModelRefused, ModelUnavailable, NoModel, SessionOwnerError
from serve_app.llm.client import LLMError
from serve_app.services.context import build_working_memory
from serve_app.services.dependencies import Dependencies
from serve_app.services.sessions import append_messages

logger = logging.getLogger("ray.serve")
ANSWER = "assistant answer"  # an answer's id is its place in the log: two racing copies store one


@dataclass
class Conversation:
    """A chat request as memory sees it."""

    user: str
    session: str
    system_prompt: str | None
    turns: list[dict[str, Any]]
    """Non-system turns in order, content as text."""


def _text(content: str | list[dict[str, Any]] | None) -> str:
    """Text parts joined; any other part (an image, audio) is refused for now."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        if part.get("type") != "text":
            raise InvalidRequest(f"content parts of type {part.get('type')!r} are not supported: only text", param="messages")
        texts.append(str(part.get("text", "")))
    return "\n".join(texts)


def conversation(deps: Dependencies, caller: Caller, request: ChatCompletionRequest, headers: dict[str, str]) -> Conversation:
    """Who speaks, in which session, with which system prompt and turns."""
    system, turns = [], []
    for message in request.messages:
        text = _text(message.content)
        if message.role in ("system", "developer"):
            system.append(text)
            continue
        turn: dict[str, Any] = {"role": message.role, "content": text}
        for key in ("name", "tool_call_id", "tool_calls"):
            if getattr(message, key):
                turn[key] = getattr(message, key)
        turns.append(turn)
    if not turns:
        raise InvalidRequest("messages hold no user, assistant or tool turn", param="messages")
    user = request.user or request.safety_identifier or headers.get("x-user-id") or deps.settings.chat_default_user
    system_prompt = "\n\n".join(system) if system else None
    session = headers.get("x-session-id") or (request.metadata or {}).get("session_id")
    if not session:
        session = derived_session_id(caller.tenant, user, system_prompt or "", turns[0])
    try:
        validate_id(user, "user")
        validate_id(session, "session id")
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="user" if "user" in str(exc) else "metadata.session_id") from None
    return Conversation(user, session, system_prompt, turns)


async def _plan(deps: Dependencies, tenant: str, talk: Conversation) -> tuple[Plan, int]:
    """What to append, and the log's length now."""
    meta = await deps.stores.log.meta(tenant, talk.session)
    if meta is not None and meta.user_id != talk.user:
        raise SessionOwnerError(meta.user_id)
    count = meta.message_count if meta else 0
    window = len(talk.turns) + 8  # a log longer than the request can only align on its tail
    stored = await deps.stores.log.read(tenant, talk.session, after=max(0, count - window)) if count else []
    seen = not count and await deps.stores.keywords.has_session(tenant, talk.user, talk.session)
    stored_prints = [fingerprint(t) for t in stored]
    return plan_append(stored_prints, talk.turns, session=talk.session, log_length=count, seen_before=seen), count


def _message_in(turn: dict[str, Any], message_id: str) -> schemas.MessageIn:
    try:
        return schemas.MessageIn(**turn, id=message_id)
    except ValidationError as exc:
        raise InvalidRequest(exc.errors(include_url=False, include_context=False), param="messages") from None


async def _append(deps: Dependencies, caller: Caller, talk: Conversation, turns: list[dict], ids: list[str]) -> list[int]:
    if not turns:
        return []
    body = schemas.AppendRequest(user_id=talk.user, messages=[_message_in(t, i) for t, i in zip(turns, ids, strict=True)])
    return (await append_messages(deps, caller, talk.session, body)).seqs


def _model_error(exc: LLMError) -> Exception:
    if exc.status_code is not None and 400 <= exc.status_code < 500:
        body = exc.body if isinstance(exc.body, dict) else {}
        return ModelRefused(exc.status_code, str(body.get("message") or exc))
    return ModelUnavailable(str(exc))


async def chat_completion(
    deps: Dependencies, caller: Caller, request: ChatCompletionRequest, headers: dict[str, str]
) -> JSONResponse | StreamingResponse:
    if deps.llm is None:
        raise NoModel()
    started = time.perf_counter()
    llm = deps.llm
    talk = conversation(deps, caller, request, headers)
    store = request.store is not False
    plan, count = await _plan(deps, caller.tenant, talk)
    stored = await _append(deps, caller, talk, plan.new, plan.ids) if store else []
    reserve = request.max_completion_tokens or request.max_tokens or deps.settings.chat_max_completion_tokens
    context = await build_working_memory(
        deps,
        caller.tenant,
        schemas.ContextRequestIn(
            user_id=talk.user,
            session_id=talk.session,
            query=next((t["content"] for t in reversed(talk.turns) if t["role"] == "user"), ""),
            system_prompt=talk.system_prompt,
            max_tokens=await llm.context_window(deps.settings.llm_context_window),
            reserve_output=reserve,
        ),
        pending_turns=[] if store else plan.new,
        tools=request.tools or [],
    )
    report = MemoryReport(
        session_id=talk.session,
        user_id=talk.user,
        stored_seqs=stored,
        recalled=[hit.id for hit in context.recalled],
        alignment=plan.alignment.value,
        memory_tokens=context.usage.sections["memory"].tokens,
        prompt_tokens=context.usage.total_tokens,
    )
    deps.observers.chat_call(plan.alignment.value, report.memory_tokens, request.stream)
    if plan.alignment in (Alignment.DIVERGED, Alignment.EXPIRED):
        logger.info("chat history %s from the log of %s/%s", plan.alignment.value, caller.tenant, talk.session)
    body = request.passthrough() | {"messages": context.messages, "max_tokens": reserve}
    answer_id = turn_id(talk.session, count + len(plan.new), ANSWER)
    keep = store and plan.alignment is not Alignment.REPLAYED
    memory_headers = {
        "X-Memory-Session-Id": talk.session,
        "X-Memory-Recalled": ",".join(report.recalled),
    }
    if request.stream:
        chunks = llm.stream(body)
        try:
            first = await anext(chunks)  # a model that is down answers with a status, not a broken stream
        except LLMError as exc:
            raise _model_error(exc) from exc
        except StopAsyncIteration:
            first = None
        return StreamingResponse(
            _stream(deps, caller, talk, first, chunks, report, answer_id if keep else None, started),
            media_type="text/event-stream",
            headers=memory_headers | {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    try:
        completion = await llm.complete(body)
    except LLMError as exc:
        raise _model_error(exc) from exc
    message = completion.choices[0].message if completion.choices else None
    if keep and message is not None:
        report.stored_seqs += await _append(deps, caller, talk, [_answer(message.content, message.tool_calls)], [answer_id])
    out = completion.model_dump(exclude_unset=True) | {"memory": report.model_dump()}
    return JSONResponse(out, headers=memory_headers | {"X-Memory-Stored-Seqs": ",".join(map(str, report.stored_seqs))})


def _answer(content: str | None, tool_calls: list[Any] | None) -> dict[str, Any]:
    """The model's answer as a turn to store. NUL characters go (no store keeps them): the answer was
    given, and refusing to store it would lose the rest."""
    turn: dict[str, Any] = {"role": "assistant", "content": (content or "").replace("\x00", "")}
    calls = [c.model_dump() if hasattr(c, "model_dump") else c for c in tool_calls or []]
    if calls:
        turn["tool_calls"] = [
            {"id": c.get("id"), "type": "function", "function": {key: c["function"][key] for key in ("name", "arguments")}}
            for c in calls
        ]
    return turn


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
    caller: Caller,
    talk: Conversation,
    first: Any,
    rest: AsyncIterator[Any],
    report: MemoryReport,
    answer_id: str | None,
    started: float,
) -> AsyncIterator[str]:
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
                yield f"data: {chunk.model_dump_json(exclude_unset=True)}\n\n"
        except LLMError as exc:  # the model broke off: no partial answer is stored
            ended = True
            error = {"message": str(_model_error(exc)), "type": "server_error", "param": None, "code": None}
            yield f"data: {json.dumps({'error': error})}\n\n"
            return
        ended = True
        if answer_id is not None:
            # Stored before [DONE], and shielded: a client that leaves now does not cut the write.
            stored = asyncio.ensure_future(_append(deps, caller, talk, [answer.turn()], [answer_id]))
            report.stored_seqs += await asyncio.shield(stored)
        tail = {"id": getattr(last, "id", ""), "object": "chat.completion.chunk", "created": getattr(last, "created", 0)}
        tail |= {"model": getattr(last, "model", ""), "choices": [], "memory": report.model_dump()}
        yield f"data: {json.dumps(tail)}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        if not ended:
            deps.observers.stream_abandoned()


async def models(deps: Dependencies) -> ModelList:
    """The one model this service answers with (none without an LLM)."""
    if deps.llm is None:
        return ModelList(data=[])
    window = await deps.llm.context_window(deps.settings.llm_context_window)
    return ModelList(data=[ModelCard(id=deps.settings.llm_model, context_window=window)])
