"""Test doubles, named as such: they stand in only for what cannot run on these CPU machines.

`ScriptedChatClient` plays a 7B instruction model (Qwen2.5-7B-Instruct on a GPU) whose answers a
random-weight tiny model cannot give: it returns scripted replies. The real serving path (vLLM,
handles, the OpenAI server) is tested beside it in tests/llm with a tiny Qwen2.
"""

from __future__ import annotations

from collections.abc import Callable

from serve_app.llm.client import ChatCall, ChatResult, LLMError


class ScriptedChatClient:
    """TEST DOUBLE of an LLM: `reply(call)` decides the answer; `down=True` makes every call fail."""

    def __init__(self, reply: Callable[[ChatCall], str]):
        self.reply = reply
        self.down = False
        self.calls: list[ChatCall] = []

    async def chat(self, call: ChatCall) -> ChatResult:
        self.calls.append(call)
        if self.down:
            raise LLMError("ConnectError: scripted outage")
        text = self.reply(call)
        return ChatResult(text=text, prompt_tokens=0, completion_tokens=len(text.split()), finish_reason="stop")
