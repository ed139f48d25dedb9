"""The LLM through the official `openai` SDK: one client for summaries, extraction and chat, in every
mode. In `openai` mode it points at any OpenAI-compatible endpoint; in `ray-serve-llm` mode at the
`ray.serve.llm` OpenAI application deployed beside this one (configs/cluster.yaml), over HTTP, so no
replica of this app imports vLLM or its request types.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import openai
from openai import AsyncOpenAI
from openai.resources.chat.completions import AsyncCompletions
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from serve_app.runtime import tracing


class LLMError(RuntimeError):
    """The model did not give a usable answer (timeout, connection, HTTP or engine error)."""

    def __init__(self, message: str, status_code: int | None = None, body: Any = None, retry_after: str | None = None):
        super().__init__(message)
        self.status_code = status_code
        self.body = body
        self.retry_after = retry_after
        """The endpoint's own Retry-After, when it sent one (a 429 or 503)."""


@dataclass
class ChatCall:
    messages: list[dict[str, Any]]
    max_tokens: int
    temperature: float = 0.0
    seed: int = 0
    response_format: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ChatResult:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None


class ChatClient(Protocol):
    async def chat(self, call: ChatCall) -> ChatResult: ...


# What `chat.completions.create` takes as arguments; any other field of a request goes in extra_body.
_CREATE_ARGS = frozenset(inspect.signature(AsyncCompletions.create).parameters) - {
    "self",
    "extra_headers",
    "extra_query",
    "extra_body",
    "timeout",
}


def _error(exc: Exception) -> LLMError:
    if isinstance(exc, openai.APIStatusError):
        retry_after = exc.response.headers.get("retry-after")
        return LLMError(f"HTTP {exc.status_code}: {exc.message}", exc.status_code, exc.body, retry_after)
    return LLMError(f"{type(exc).__name__}: {exc}")


class OpenAIChatClient:
    """An OpenAI-compatible endpoint: a vLLM server, the ray.serve.llm OpenAI app, another provider.

    No retries in the SDK: a failed summary or extraction is retried by the memorizer's LLM lane,
    and a chat request by its client."""

    def __init__(self, base_url: str, model: str, api_key: str = "", timeout_s: float = 30.0):
        self.client = AsyncOpenAI(base_url=base_url.rstrip("/"), api_key=api_key or "none", timeout=timeout_s, max_retries=0)
        self.model = model
        self._window: int | None = None

    async def chat(self, call: ChatCall) -> ChatResult:
        body: dict[str, Any] = {
            "messages": call.messages,
            "max_tokens": call.max_tokens,
            "temperature": call.temperature,
            "seed": call.seed,
            **call.extra,
        }
        if call.response_format is not None:
            body["response_format"] = call.response_format
        completion = await self.complete(body)
        try:
            choice = completion.choices[0]
            usage = completion.usage
            return ChatResult(
                text=choice.message.content or "",
                prompt_tokens=usage.prompt_tokens if usage else 0,
                completion_tokens=usage.completion_tokens if usage else 0,
                finish_reason=choice.finish_reason,
            )
        except (AttributeError, IndexError, TypeError) as exc:
            raise LLMError(f"malformed chat completion: {str(completion)[:300]}") from exc

    def _arguments(self, body: dict[str, Any], span: Any = None) -> dict[str, Any]:
        known = {k: v for k, v in body.items() if k in _CREATE_ARGS}
        extra = {k: v for k, v in body.items() if k not in _CREATE_ARGS}
        arguments = {**known, "model": self.model} | ({"extra_body": extra} if extra else {})
        if tracing.enabled():  # the upstream's own spans (vLLM's, a gateway's) join the request's trace
            headers: dict[str, str] = {}
            tracing.inject(headers, span)
            arguments["extra_headers"] = headers
        return arguments

    async def complete(self, body: dict[str, Any]) -> ChatCompletion:
        """One chat completion of an OpenAI request body (the model is always this client's)."""
        with tracing.span(f"chat {self.model}", kind="client", attributes=self._request_attributes(body)) as span:
            try:
                completion = await self.client.chat.completions.create(**self._arguments(body | {"stream": False}))
            except openai.OpenAIError as exc:
                raise _error(exc) from exc
            if span.is_recording():
                _response_attributes(span, completion)
            return completion

    async def stream(self, body: dict[str, Any]) -> AsyncIterator[ChatCompletionChunk]:
        """The chunks of a streamed chat completion, as the model gives them."""
        # Not made current: the span lives across this generator's yields, where the consumer's
        # context is not the generator's.
        span = tracing.start_span(f"chat {self.model}", kind="client", attributes=self._request_attributes(body))
        error: BaseException | None = None
        first = True
        try:
            chunks = await self.client.chat.completions.create(**self._arguments(body | {"stream": True}, span))
            async for chunk in chunks:
                if span.is_recording():
                    if first:
                        span.add_event("gen_ai.first_chunk")
                        first = False
                    _response_attributes(span, chunk)
                yield chunk
        except openai.OpenAIError as exc:
            error = _error(exc)
            raise error from exc
        except BaseException as exc:
            error = exc
            raise
        finally:
            tracing.end_span(span, error if not isinstance(error, GeneratorExit) else None)

    def _request_attributes(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The GenAI semantic conventions' request attributes (the model is always this client's)."""
        if not tracing.enabled():
            return None
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.system": "openai",
            "gen_ai.request.model": self.model,
            "server.address": self.client.base_url.host,
        }
        if self.client.base_url.port is not None:
            attributes["server.port"] = self.client.base_url.port
        for key, name in _REQUEST_ATTRIBUTES.items():
            value = body.get(key)
            if isinstance(value, int | float | str) and not isinstance(value, bool):
                attributes[name] = value
        if isinstance(format_ := body.get("response_format"), dict) and "type" in format_:
            attributes["gen_ai.output.type"] = "json" if format_["type"] in ("json_schema", "json_object") else format_["type"]
        return attributes

    async def context_window(self, default: int) -> int:
        """The model's context window as the endpoint reports it (vLLM's `max_model_len`, or the
        `max_request_context_length` of a ray.serve.llm model card), asked once; else `default`."""
        if self._window is None:
            try:
                cards = [card async for card in self.client.models.list() if card.id == self.model]
            except openai.OpenAIError:
                return default  # asked again next time: the endpoint may be starting
            extra = (cards[0].model_extra or {}) if cards else {}
            reported = extra.get("max_model_len") or (extra.get("metadata") or {}).get("max_request_context_length")
            self._window = int(reported) if reported else default
        return self._window

    async def close(self) -> None:
        await self.client.close()


_REQUEST_ATTRIBUTES = {
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "seed": "gen_ai.request.seed",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
}


def _response_attributes(span: Any, reply: ChatCompletion | ChatCompletionChunk) -> None:
    """The response's attributes, from a completion or from each chunk as it comes (the id and model
    come with every chunk, the finish reasons and the usage with the last ones)."""
    if reply.id:
        span.set_attribute("gen_ai.response.id", reply.id)
    if reply.model:
        span.set_attribute("gen_ai.response.model", reply.model)
    reasons = [c.finish_reason for c in reply.choices or () if c.finish_reason]
    if reasons:
        span.set_attribute("gen_ai.response.finish_reasons", reasons)
    if (usage := reply.usage) is not None:
        span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)


def llm_client(settings) -> OpenAIChatClient | None:
    """The client of the configured LLM (the same in the Ingress and the Memorizer), or None."""
    if settings.llm_mode == "none":
        return None
    return OpenAIChatClient(settings.llm_base_url, settings.llm_model, settings.llm_api_key, settings.llm_timeout_s)
