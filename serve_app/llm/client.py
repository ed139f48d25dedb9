"""Chat clients with one call shape, so prompts and parsing are the same in every mode."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx


class LLMError(RuntimeError):
    """The model did not give a usable answer (timeout, connection, HTTP or engine error)."""


@dataclass
class ChatCall:
    messages: list[dict[str, str]]
    max_tokens: int
    temperature: float = 0.0
    seed: int = 0
    response_format: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def body(self, model: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "messages": self.messages,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "seed": self.seed,
            "stream": False,
        }
        if self.response_format is not None:
            body["response_format"] = self.response_format
        return body | self.extra


@dataclass
class ChatResult:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None


class ChatClient(Protocol):
    async def chat(self, call: ChatCall) -> ChatResult: ...


def _result_from_openai(data: dict[str, Any]) -> ChatResult:
    try:
        choice = data["choices"][0]
        usage = data.get("usage") or {}
        return ChatResult(
            text=choice["message"].get("content") or "",
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            finish_reason=choice.get("finish_reason"),
        )
    except (KeyError, IndexError, TypeError) as exc:
        raise LLMError(f"malformed chat completion: {str(data)[:300]}") from exc


class OpenAIChatClient:
    """Any OpenAI-compatible endpoint: a standalone vLLM server, or another provider."""

    def __init__(self, base_url: str, model: str, api_key: str = "", timeout_s: float = 30.0):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s)
        self.model = model

    async def chat(self, call: ChatCall) -> ChatResult:
        try:
            response = await self.http.post("/chat/completions", json=call.body(self.model))
        except httpx.HTTPError as exc:
            raise LLMError(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise LLMError(f"HTTP {response.status_code}: {response.text[:300]}")
        return _result_from_openai(response.json())

    async def close(self) -> None:
        await self.http.aclose()


class ServeLLMClient:
    """A `ray.serve.llm` LLM deployment reached through its handle (streamed async generator)."""

    def __init__(self, handle: Any, model: str, timeout_s: float = 30.0):
        self.handle = handle
        self.model = model
        self.timeout_s = timeout_s

    async def _call(self, call: ChatCall) -> ChatResult:
        from ray.serve.llm.openai_api_models import ChatCompletionRequest  # imports vLLM: only here

        request = ChatCompletionRequest(**call.body(self.model))
        last: Any = None
        async for item in self.handle.options(stream=True).chat.remote(request):
            last = item
        if last is None:
            raise LLMError("the LLM deployment returned nothing")
        data = last.model_dump() if hasattr(last, "model_dump") else last
        if isinstance(data, dict) and "choices" not in data:
            raise LLMError(f"LLM deployment error: {str(data)[:300]}")
        return _result_from_openai(data)

    async def chat(self, call: ChatCall) -> ChatResult:
        try:
            return await asyncio.wait_for(self._call(call), timeout=self.timeout_s)
        except LLMError:
            raise
        except Exception as exc:  # timeouts, dead replicas, engine errors: all mean "no answer"
            raise LLMError(f"{type(exc).__name__}: {exc}") from exc
