"""Deploy the real Serve app (configs/local.yaml) on a local Ray, against the embedded backends."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest

from serve_app.cli import DEFAULT_CONFIG
from serve_app.core.auth import hash_key
from serve_app.deploy.local_ray import ray_temp_dir, start_serving
from serve_app.deploy.serve_config import load_serve_config
from serve_app.embedded.ports import free_port

# API keys of the test app: tenant "local" (what the other tests use) and more tenants.
KEY_LOCAL, KEY_B, KEY_SLOW = "key-local-0123456789", "key-tenant-b-0123456789", "key-slow-0123456789"
KEY_SMALL = "key-small-0123456789"  # tenant "tenant-small": a quota of 3 stored memories
# tenant "tenant-tiny": the same quota for the client's test, which fills it; a quota is per tenant, so
# sharing tenant-small would leave test_tenants' quota test no room for its own writes.
KEY_TINY = "key-tiny-0123456789"
KEY_RETRY = "key-retry-0123456789"  # tenant "tenant-retry": 60 messages a minute, so a 429 asks for ~1 s
KEY_INSPECT = "key-inspect-0123456789"  # tenant "inspector": the inspector's tests, whose audit log is theirs alone
UI_SECRET = "test-ui-secret-0123456789abcdef"
KEY_TEAM_ADMIN = "key-team-admin-0123456789"  # tenant "team", its admin: creates memory spaces
KEY_TEAM_MEMBER = "key-team-member-0123456789"  # tenant "team": what its grants allow, nothing more
KEY_FUZZ = "key-fuzz-0123456789"  # tenant "fuzz": the Schemathesis run, whose random DELETEs must not touch other tests' data
# Test profile: compact early and sweep often so the tests see compaction and memorization quickly.
TEST_ARGS = {
    "compaction_trigger_tokens": 1000,
    "memorizer_sweep_interval_s": 0.2,
    "api_keys": {
        hash_key(KEY_LOCAL): "local",
        hash_key(KEY_B): "tenant-b",
        hash_key(KEY_SLOW): "tenant-slow",
        hash_key(KEY_FUZZ): "fuzz",
        hash_key(KEY_SMALL): "tenant-small",
        hash_key(KEY_TINY): "tenant-tiny",
        hash_key(KEY_RETRY): "tenant-retry",
        hash_key(KEY_INSPECT): "inspector",
        hash_key(KEY_TEAM_ADMIN): "team:admin",
        hash_key(KEY_TEAM_MEMBER): "team",
    },
    "ui_secret": UI_SECRET,
    "rate_limit_overrides": {"tenant-slow": 5, "tenant-retry": 60},
    "quota_overrides": {"tenant-small": 3, "tenant-tiny": 3},
}


@pytest.fixture(scope="session")
def metrics_port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def metrics_url(service_url, metrics_port) -> str:
    return f"http://127.0.0.1:{metrics_port}/metrics"


@pytest.fixture(scope="session")
def spans_dir(data_root) -> Path:
    return data_root / "spans"


@pytest.fixture(scope="session")
def service_url(backends, data_root, metrics_port, spans_dir) -> str:
    import ray
    from ray import serve

    os.environ.update(backends.app_env)
    # Tracing on, every span to a file per replica process (test_tracing.py reads them back); the
    # batch processor writes them out within 0.2 s rather than its default 5.
    os.environ.setdefault("OTEL_BSP_SCHEDULE_DELAY", "200")
    port = free_port()
    config = load_serve_config(DEFAULT_CONFIG, host="127.0.0.1", port=port)
    config.applications[0].args = {**TEST_ARGS, "tracing": True, "tracing_spans_dir": str(spans_dir)}
    start_serving(ray_temp_dir(data_root), config, metrics_port=metrics_port)
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()
    ray.shutdown()


@pytest.fixture
def client(service_url):
    with httpx.Client(base_url=service_url, timeout=60, headers={"Authorization": f"Bearer {KEY_LOCAL}"}) as c:
        yield c


def wait_memorized(client: httpx.Client, session_id: str, upto: int, timeout_s: float = 90) -> dict:
    deadline = time.monotonic() + timeout_s
    info = {}
    while time.monotonic() < deadline:
        info = client.get(f"/v1/sessions/{session_id}").json()
        if info.get("memorized_upto_seq", 0) >= upto:
            return info
        time.sleep(0.2)
    raise AssertionError(f"memorizer did not reach seq {upto}: {info}")
