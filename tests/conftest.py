"""Fixtures that start the real embedded servers with the launchers `memserve up` uses."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from serve_app.embedded.launchers import EmbeddedBackends, Ports

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
