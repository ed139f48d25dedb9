"""Nothing lost, no one let in: API keys, tenant isolation, hostile ids, limits and forgetting a user."""

from __future__ import annotations

import subprocess
import sys
import uuid
from urllib.parse import quote

import httpx
import pytest

from bench.probes import HOSTILE_IDS as HOSTILE
from bench.probes import endpoints as _endpoints
from bench.probes import tenant_endpoints
from serve_app.core.ids import MAX_ID_LENGTH
from serve_app.settings import Settings
from serve_app.stores.vectors import partition_of

from .conftest import KEY_B, KEY_SLOW, KEY_SMALL, wait_memorized


def _sid(prefix: str = "s") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def tenant_b(service_url):
    with httpx.Client(base_url=service_url, timeout=60, headers={"X-API-Key": KEY_B}) as c:
        yield c


@pytest.fixture
def anonymous(service_url):
    with httpx.Client(base_url=service_url, timeout=60) as c:
        yield c


def test_every_endpoint_needs_a_valid_key(anonymous, service_url):
    for method, path, body in [*_endpoints("s1", "u1"), *tenant_endpoints()]:
        r = anonymous.request(method, path, json=body)
        assert r.status_code == 401, (method, path, r.status_code)
        assert r.json()["detail"] and r.headers["www-authenticate"] == "Bearer"
        wrong = anonymous.request(method, path, json=body, headers={"Authorization": "Bearer not-a-key"})
        assert wrong.status_code == 401
    assert anonymous.get("/healthz").status_code == 200
    assert "HTTPBearer" in str(anonymous.get("/openapi.json").json()["components"]["securitySchemes"])


def test_another_tenant_can_neither_read_nor_change_anything(client, tenant_b):
    sid, user = _sid(), _sid("user")
    secret = "the launch code is 0000-SECRET"
    client.post(f"/v1/sessions/{sid}/messages", json={"user_id": user, "messages": [{"role": "user", "content": secret}]})
    client.put(f"/v1/users/{user}/facts/plan", json={"value": "secret plan", "category": "fact"}).raise_for_status()
    wait_memorized(client, sid, 1)
    before_log = client.get(f"/v1/sessions/{sid}/messages").json()["messages"]

    successes = []
    for method, path, body in [*_endpoints(sid, user), *tenant_endpoints()]:
        r = tenant_b.request(method, path, json=body)
        assert r.status_code < 500, (method, path, r.text)
        text = r.text
        if "SECRET" in text or "secret plan" in text:
            successes.append((method, path))
        if path.startswith("/v1/sessions/") and method != "POST" or path.endswith("/compress"):
            assert r.status_code == 404, (method, path)  # another tenant's session does not exist for B
    assert successes == []
    # A's data is untouched by everything B did (B's writes landed in B's own namespace).
    assert client.get(f"/v1/sessions/{sid}/messages").json()["messages"] == before_log
    assert client.get(f"/v1/users/{user}/facts/plan").json()["value"] == "secret plan"
    assert [h["text"] for h in client.post(f"/v1/users/{user}/memories/search", json={"query": "launch code"}).json()][:1] == [
        secret
    ]


def test_one_memory_id_in_two_tenants_is_two_memories(client, tenant_b):
    """Memory ids are each user's own, also for users whose memories share a Milvus partition; and an
    id as long as the API accepts is stored, found and deleted like any other."""
    user = _sid("user")
    partitions = Settings().milvus_partitions
    shared = partition_of("local", user, partitions)
    other = next(u for u in (f"{user}-{i}" for i in range(10_000)) if partition_of("tenant-b", u, partitions) == shared)
    longest = "n" * MAX_ID_LENGTH
    for c, who, memory_id, text in (
        (tenant_b, other, "note-1", "Tenant B's note: the boiler is serviced in May."),
        (client, user, "note-1", "Local note: the spare key is under the blue pot."),
        (client, user, longest, "Local note with the longest id: flights leave from gate 12."),
    ):
        c.post(f"/v1/users/{who}/memories", json={"id": memory_id, "text": text}).raise_for_status()
    for c, who, query, memory_id in (
        (tenant_b, other, "when is the boiler serviced?", "note-1"),
        (client, user, "where is the spare key?", "note-1"),
        (client, user, "which gate do flights leave from?", longest),
    ):
        hits = c.post(f"/v1/users/{who}/memories/search", json={"query": query, "top_k": 1}).raise_for_status().json()
        assert [h["id"] for h in hits] == [memory_id], (who, query, hits)
    assert client.delete(f"/v1/users/{user}/memories/{longest}").status_code == 200
    assert "boiler" in tenant_b.get(f"/v1/users/{other}/memories").json()[0]["text"]


def test_hostile_ids_are_refused_with_4xx_everywhere(client):
    refused = 0
    for hostile in HOSTILE:
        if hostile:
            r = client.get(f"/v1/users/{quote(hostile, safe='')}/facts")
            assert 400 <= r.status_code < 500 and r.json()["detail"], (hostile, r.status_code)
        for body in (
            {"user_id": hostile, "messages": [{"role": "user", "content": "x"}]},
            {"user_id": "u", "messages": [{"role": "user", "content": "x", "id": hostile}]},
        ):
            r = client.post(f"/v1/sessions/{_sid()}/messages", json=body)
            assert r.status_code == 422 and r.json()["detail"], (hostile, r.text)
            refused += 1
        r = client.post("/v1/context", json={"user_id": hostile, "session_id": "s"})
        assert r.status_code == 422
    assert refused == 2 * len(HOSTILE)


def test_rate_limit_is_a_429_with_retry_after(service_url):
    with httpx.Client(base_url=service_url, timeout=60, headers={"X-API-Key": KEY_SLOW}) as slow:
        sid = _sid()
        statuses = []
        for i in range(7):
            r = slow.post(
                f"/v1/sessions/{sid}/messages", json={"user_id": "u", "messages": [{"role": "user", "content": f"m{i}"}]}
            )
            statuses.append(r.status_code)
        assert statuses[:5] == [200] * 5 and statuses[5] == 429
        limited = slow.post(f"/v1/sessions/{sid}/messages", json={"user_id": "u", "messages": [{"role": "user", "content": "x"}]})
        assert 1 <= int(limited.headers["retry-after"]) <= 60 and "rate limit" in limited.json()["detail"]
        assert len(slow.get(f"/v1/sessions/{sid}/messages").json()["messages"]) == 5  # refused writes were not stored


def test_stored_memory_quota_is_a_429_and_keeps_what_was_stored(service_url):
    """tenant-small may store 3 memories: the 4th write is refused, appends too, nothing stored is lost."""
    with httpx.Client(base_url=service_url, timeout=60, headers={"X-API-Key": KEY_SMALL}) as small:
        user, sid = _sid("user"), _sid()
        for i in range(2):
            assert small.post(f"/v1/users/{user}/memories", json={"text": f"memory {i}"}).status_code == 200
        r = small.post(f"/v1/sessions/{sid}/messages", json={"user_id": user, "messages": [{"role": "user", "content": "m"}]})
        assert r.status_code == 200
        wait_memorized(small, sid, 1)  # the appended turn is the third stored memory
        refused = small.post(f"/v1/users/{user}/memories", json={"text": "one too many"})
        assert refused.status_code == 429 and "quota of 3 stored memories" in refused.json()["detail"]
        assert int(refused.headers["retry-after"]) > 0
        again = small.post(f"/v1/sessions/{sid}/messages", json={"user_id": user, "messages": [{"role": "user", "content": "x"}]})
        assert again.status_code == 429
        assert len(small.get(f"/v1/users/{user}/memories").json()) == 3
        assert [m["content"] for m in small.get(f"/v1/sessions/{sid}/messages").json()["messages"]] == ["m"]
        # Deleting frees space: the next write is accepted.
        memory_id = small.get(f"/v1/users/{user}/memories").json()[0]["id"]
        assert small.delete(f"/v1/users/{user}/memories/{memory_id}").status_code == 200
        assert small.post(f"/v1/users/{user}/memories", json={"text": "fits again"}).status_code == 200


def test_oversize_body_is_refused_before_parsing(client):
    r = client.post(
        f"/v1/sessions/{_sid()}/messages",
        content=b'{"user_id": "u", "messages": [' + b" " * (9 * 1024 * 1024) + b"]}",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413 and "limit" in r.json()["detail"]


def test_deep_tool_arguments_are_refused(client):
    deep: dict = {}
    node = deep
    for _ in range(40):
        node["x"] = {}
        node = node["x"]
    call = {"function": {"name": "f", "arguments": deep}}
    r = client.post(
        f"/v1/sessions/{_sid()}/messages", json={"user_id": "u", "messages": [{"role": "assistant", "tool_calls": [call]}]}
    )
    assert r.status_code == 422 and "deep" in r.text


def test_forget_a_user_removes_everything(client):
    user = _sid("user")
    sessions = [_sid(), _sid()]
    for sid in sessions:
        client.post(
            f"/v1/sessions/{sid}/messages",
            json={"user_id": user, "messages": [{"role": "user", "content": f"private note in {sid}"}]},
        )
        wait_memorized(client, sid, 1)
    client.put(f"/v1/users/{user}/facts/city", json={"value": "Lyon", "category": "fact"})
    client.put(f"/v1/users/{user}/facts/city", json={"value": "Paris", "category": "fact"})
    client.post(f"/v1/users/{user}/memories", json={"text": "likes tea"})
    other = _sid("user")
    client.put(f"/v1/users/{other}/facts/city", json={"value": "Rome", "category": "fact"})

    r = client.delete(f"/v1/users/{user}")
    assert r.status_code == 200, r.text
    assert r.json()["details"] == {
        "sessions": 2, "vectors": 3, "keywords": 3, "facts": 2, "promoted_memories": 0, "promoted_facts": 0,
    }
    for sid in sessions:
        assert client.get(f"/v1/sessions/{sid}").status_code == 404
    assert client.get(f"/v1/users/{user}/sessions").json()["sessions"] == []
    assert client.get(f"/v1/users/{user}/memories").json() == []
    assert client.get(f"/v1/users/{user}/facts/city/history").status_code == 404
    assert client.post(f"/v1/users/{user}/memories/search", json={"query": "private note"}).json() == []
    assert client.get(f"/v1/users/{other}/facts/city").json()["value"] == "Rome"  # nobody else touched


def test_non_loopback_without_keys_refuses_to_start(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "serve_app.cli", "up", "--host", "0.0.0.0", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "without API keys" in result.stdout
    assert not (tmp_path / "redis").exists()  # refused before starting anything


def test_keys_are_configured_hashed(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "serve_app.cli", "hash-key", "acme"], capture_output=True, text=True, check=True
    ).stdout
    key = out.split("key (give to the client, not stored): ")[1].split()[0]
    line = out.split("api_keys_file line: ")[1].strip()
    keys = tmp_path / "keys"
    keys.write_text(f"# tenants\n{line}\n")
    from serve_app.core.auth import KeyRing

    ring = KeyRing.from_file(keys)
    assert ring.tenant_for(key)[0] == "acme" and ring.tenant_for(key + "x") is None
    assert key not in keys.read_text()
