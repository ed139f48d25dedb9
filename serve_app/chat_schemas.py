"""OpenAI-compatible request and response models of `/v1/chat/completions` and `/v1/models`.

Only what the service reads is declared; every other field of a request (temperature, tools,
tool_choice, stop, seed, response_format, ...) is kept and passed to the model as it came.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ChatFunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(max_length=256)
    arguments: str | dict[str, Any] = ""


class ChatToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str | None = Field(None, max_length=128)
    type: str = "function"
    function: ChatFunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = Field(None, max_length=128)
    tool_calls: list[ChatToolCall] | None = Field(None, max_length=32)
    tool_call_id: str | None = Field(None, max_length=128)


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=256)
    messages: list[ChatMessage] = Field(min_length=1, max_length=1000)
    stream: bool = False
    user: str | None = Field(None, description="The memory's user (or `safety_identifier`, or the X-User-Id header).")
    safety_identifier: str | None = None
    metadata: dict[str, str] | None = Field(None, description="`session_id` here names the session (or X-Session-Id).")
    store: bool | None = Field(None, description="false: nothing of this call is stored.")
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int | None = Field(None, ge=1, le=1)
    tools: list[dict[str, Any]] | None = Field(None, max_length=128)

    def passthrough(self) -> dict[str, Any]:
        """The fields the model gets as they came: everything but what memory handles itself."""
        handled = {"model", "messages", "stream", "user", "safety_identifier", "metadata", "store", "max_tokens",
                   "max_completion_tokens", "n"}  # fmt: skip
        return {k: v for k, v in self.model_dump(exclude_unset=True).items() if k not in handled}


class MemoryReport(BaseModel):
    """What memory did for a chat call: the extension field `memory` of a response (and its last chunk)."""

    session_id: str
    user_id: str
    stored_seqs: list[int] = Field(description="Seqs of this call's turns in the session log, the answer's included.")
    recalled: list[str] = Field(description="Ids of the long-term memories recalled into the prompt.")
    alignment: str = Field(description="new, continues, latest, diverged, expired or retried (docs/api/chat.md).")
    memory_tokens: int = Field(description="Tokens of recalled memories and facts in the prompt.")
    prompt_tokens: int = Field(description="The prompt's tokens as this service counted them.")


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "agent-memory-serve"
    context_window: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
