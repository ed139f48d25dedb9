"""A Milvus (Lite or server) of a test's own and nothing else: a test that kills, freezes or
restarts Milvus must not do it to the session's, and needs no Redis or PostgreSQL of its own."""

from __future__ import annotations

import functools
from pathlib import Path

from serve_app.embedded.launchers import milvus_starter
from serve_app.embedded.ports import free_port


class OwnMilvus:
    def __init__(self, data_dir: Path, engine: str = "lite"):
        self._start = functools.partial(milvus_starter(engine), data_dir, free_port())
        self.backend = self._start()

    @property
    def url(self) -> str:
        return self.backend.url

    def restart(self) -> None:
        """Stop it if it runs, and start it again on its data dir and port."""
        self.backend.stop()
        self.backend = self._start()

    def discard(self) -> None:
        """Kill it, at the end of a test: its data goes with it, and a Milvus server's own shutdown
        hangs until the grace of a stop runs out."""
        self.backend.kill()
