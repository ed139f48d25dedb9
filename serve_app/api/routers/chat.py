"""OpenAI-compatible chat with memory: point an OpenAI client's base_url here (errors in OpenAI's shape)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from serve_app.api.state import Deps, Who
from serve_app.chat_schemas import ChatCompletionRequest, ModelList
from serve_app.services import chat

router = APIRouter(tags=["OpenAI-compatible chat"])


@router.post("/v1/chat/completions", summary="Chat completion with memory (OpenAI-compatible, streaming too)")
async def chat_completions(body: ChatCompletionRequest, request: Request, deps: Deps, who: Who):
    """Stores the turns the session lacks, answers from working memory, stores the answer.
    The user: `user`, `safety_identifier` or X-User-Id; the session: X-Session-Id or
    `metadata.session_id`, else one derived from the conversation's start."""
    return await chat.chat_completion(deps, who, body, dict(request.headers))


@router.get("/v1/models", response_model=ModelList, summary="The model behind the chat endpoint")
async def list_models(deps: Deps, who: Who) -> ModelList:
    return await chat.models(deps)
