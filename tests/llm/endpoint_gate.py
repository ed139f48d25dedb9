"""A TCP gate in front of the model's endpoint, for an outage without a restart of vLLM (a minute
on two cores). Closed, the endpoint is gone as a stopped one is: its port refuses connections
and every open connection is closed, a client's pooled ones too. Opened, it answers again on the
same port, as a restarted one does. Bytes pass through untouched."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from serve_app.embedded.ports import free_port


class EndpointGate:
    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task] = set()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> EndpointGate:
        self._thread.start()
        self.open()
        return self

    def open(self) -> None:
        self._run(self._open())

    def close(self) -> None:
        self._run(self._close())

    def stop(self) -> None:
        self.close()
        self._loop.call_soon_threadsafe(self._loop.stop)

    def _run(self, step) -> None:
        asyncio.run_coroutine_threadsafe(step, self._loop).result(30)

    async def _open(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._connect, "127.0.0.1", self.port)

    async def _close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for connection in list(self._connections):
            connection.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def _connect(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        upstream_writer = None
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            await asyncio.gather(_pipe(client_reader, upstream_writer), _pipe(upstream_reader, client_writer))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for writer in (client_writer, upstream_writer):
                if writer is not None:
                    writer.close()
            self._connections.discard(task)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    with contextlib.suppress(OSError):
        writer.write_eof()
