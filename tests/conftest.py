"""Fixtures that start the real embedded servers with the launchers `memserve up` uses."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from serve_app.embedded.launchers import EmbeddedBackends, Ports, free_port

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def data_root() -> Path:
    path = Path(tempfile.mkdtemp(prefix="memserve-test-"))
    return path


@pytest.fixture(scope="session")
def backends(data_root: Path):
    """One real Redis, PostgreSQL and Milvus Lite for the session, on free loopback ports."""
    started = EmbeddedBackends(data_root / "backends", Ports.free()).start()
    yield started
    started.stop()


@pytest.fixture(scope="session")
def milvus_server(data_root: Path):
    """A real Milvus standalone server (the `milvus` wheel), for the tests that run on both engines."""
    from serve_app.embedded.milvus_server import start_milvus_server

    started = start_milvus_server(data_root / "milvus-server", free_port())
    yield started
    started.stop()


@pytest.fixture(scope="session", params=["lite", "server"])
def milvus_uri(request) -> str:
    """The Milvus of the session's backends (Lite), then a Milvus server: a store test runs on both."""
    if request.param == "lite":
        return request.getfixturevalue("backends").env["MILVUS_URI"]
    return request.getfixturevalue("milvus_server").url
