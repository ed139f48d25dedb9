"""A recording HTTP proxy in front of the real model: every request body the service sends the model
is kept, and the answer (streamed too) passes through unchanged. Not a double: the model answers."""

from __future__ import annotations

import asyncio
import json
import threading

from aiohttp import ClientSession, ClientTimeout, web

from serve_app.embedded.ports import free_port


class RecordingProxy:
    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.port = free_port()
        self.requests: list[dict] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def chat_requests(self) -> list[dict]:
        return [r for r in self.requests if "messages" in r]

    def last_asking(self, text: str) -> dict:
        """The newest chat request whose last message says `text` (the memorizer's own calls for
        summaries and extraction go the same way, in between)."""
        asking = [r for r in self.chat_requests() if str(r["messages"][-1].get("content") or "").strip() == text]
        assert asking, f"no request to the model ended with {text!r}"
        return asking[-1]

    def start(self) -> RecordingProxy:
        self._thread.start()
        self._ready.wait(30)
        return self

    def stop(self) -> None:
        """Stop, and close the connections to the model of requests still in flight (a memorizer's
        call when its service went away): the endpoint waits for every open connection before it
        shuts down, a minute before it is killed."""
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", "/v1/{tail:.*}", self._forward)
        self._runner = runner = web.AppRunner(app, shutdown_timeout=1)  # then in-flight requests are cancelled
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if body:
            self.requests.append(json.loads(body))
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "authorization", "accept")}
        async with ClientSession(timeout=ClientTimeout(total=600)) as session:
            url = f"{self.upstream}/{request.match_info['tail']}"
            async with session.request(request.method, url, data=body or None, headers=headers) as upstream:
                response = web.StreamResponse(status=upstream.status, headers={"Content-Type": upstream.content_type})
                await response.prepare(request)
                async for piece in upstream.content.iter_any():
                    await response.write(piece)
                await response.write_eof()
                return response
