"""OpenAI-compatible chat with memory: point an OpenAI client's base_url here (errors in OpenAI's shape)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from serve_app.api.state import Deps, Who
from serve_app.chat_schemas import ChatCompletionRequest, ModelList
from serve_app.services import chat

router = APIRouter(tags=["OpenAI-compatible chat"])
NO_BUFFERING = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
"""A stream reaches the client chunk by chunk: no cache or proxy holds it back."""


@router.post("/v1/chat/completions", summary="Chat completion with memory (OpenAI-compatible, streaming too)")
async def chat_completions(body: ChatCompletionRequest, request: Request, deps: Deps, who: Who):
    """Stores the turns the session lacks, answers from working memory, stores the answer.
    The user: `user`, `safety_identifier` or X-User-Id; the session: X-Session-Id or
    `metadata.session_id`, else one derived from the conversation's start."""
    reply = await chat.chat_completion(deps, who, body, dict(request.headers))
    if isinstance(reply, chat.Completion):
        return JSONResponse(reply.body, headers=reply.memory_headers)
    return StreamingResponse(
        server_sent(reply.events), media_type="text/event-stream", headers=reply.memory_headers | NO_BUFFERING
    )


async def server_sent(events: AsyncGenerator[str, None]) -> AsyncGenerator[str, None]:
    """Each event's data as a server-sent event. Closing the response closes the service's stream
    at once, so a client that goes away is seen there (the answer it was owed is still stored)."""
    async with aclosing(events):
        async for data in events:
            yield f"data: {data}\n\n"


@router.get("/v1/models", response_model=ModelList, summary="The model behind the chat endpoint")
async def list_models(deps: Deps, who: Who) -> ModelList:
    return await chat.models(deps)
