"""Memory spaces over HTTP: a key without a grant sees nothing of a space by any route, grants
change what a key may do at once, and a context names the space each memory came from."""

from __future__ import annotations

import uuid

import httpx
import pytest

from bench.probes import space_endpoints
from serve_app.core.auth import hash_key

from .conftest import KEY_B, KEY_TEAM_ADMIN, KEY_TEAM_MEMBER, wait_memorized

SECRET = "the release signing key lives in vault path kv/release-SECRET"


def _id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def principal(key: str) -> str:
    return "key:" + hash_key(key)[:12]


@pytest.fixture
def admin(service_url):
    with httpx.Client(base_url=service_url, timeout=60, headers={"X-API-Key": KEY_TEAM_ADMIN}) as c:
        yield c


@pytest.fixture
def member(service_url):
    with httpx.Client(base_url=service_url, timeout=60, headers={"X-API-Key": KEY_TEAM_MEMBER}) as c:
        yield c


@pytest.fixture
def other_tenant(service_url):
    with httpx.Client(base_url=service_url, timeout=60, headers={"X-API-Key": KEY_B}) as c:
        yield c


@pytest.fixture
def space(admin):
    name = _id("team")
    admin.post("/v1/spaces", json={"space_id": name}).raise_for_status()
    admin.post(f"/v1/spaces/{name}/memories", json={"text": SECRET, "id": "m1", "agent_id": "release-bot"}).raise_for_status()
    admin.put(f"/v1/spaces/{name}/facts/plan", json={"value": "secret plan: ship Friday"}).raise_for_status()
    yield name
    admin.delete(f"/v1/spaces/{name}")


def test_a_key_without_a_grant_sees_nothing_of_a_space_by_any_route(space, admin, member, other_tenant):
    user = _id("user")
    for client in (member, other_tenant):
        for method, path, body in space_endpoints(space, user):
            r = client.request(method, path, json=body)
            expected = 403 if path == "/v1/spaces" else 404
            assert r.status_code == expected, (method, path, r.status_code, r.text)
            assert "SECRET" not in r.text and "secret plan" not in r.text
        assert space not in client.get("/v1/spaces").text
    # Nothing any of that did changed the space.
    memories = admin.get(f"/v1/spaces/{space}/memories").json()
    assert [(m["id"], m["text"], m["agent_id"], m["added_by"]) for m in memories] == [
        ("m1", SECRET, "release-bot", principal(KEY_TEAM_ADMIN))
    ]
    assert admin.get(f"/v1/spaces/{space}/facts").json()[0]["value"] == "secret plan: ship Friday"
    assert [g["principal"] for g in admin.get(f"/v1/spaces/{space}/grants").json()] == [principal(KEY_TEAM_ADMIN)]


def test_grants_change_what_a_key_may_do(space, admin, member):
    user = _id("user")
    search = {"query": "where is the release signing key?", "spaces": [space]}
    grant = f"/v1/spaces/{space}/grants/{principal(KEY_TEAM_MEMBER)}"
    admin.put(grant, json={"role": "read"}).raise_for_status()

    hits = member.post(f"/v1/users/{user}/memories/search", json=search).json()
    assert [(h["text"], h["space"], h["agent_id"]) for h in hits] == [(SECRET, space, "release-bot")]
    refused = member.post(f"/v1/spaces/{space}/memories", json={"text": "injected"})
    assert refused.status_code == 403 and "write" in refused.json()["detail"]
    assert member.get(f"/v1/spaces/{space}/grants").status_code == 403

    admin.put(grant, json={"role": "write"}).raise_for_status()
    member.post(f"/v1/users/{user}/memories", json={"text": "Our canary runs in zone b.", "agent_id": "sre"}).raise_for_status()
    mine = member.get(f"/v1/users/{user}/memories").json()[0]
    promoted = member.post(f"/v1/users/{user}/memories/{mine['id']}/promote", json={"space": space}).json()
    assert (promoted["origin_user"], promoted["origin_memory"], promoted["agent_id"]) == (user, mine["id"], "sre")
    assert promoted["added_by"] == principal(KEY_TEAM_MEMBER)

    context = member.post(
        "/v1/context", json={"user_id": user, "session_id": _id("s"), "query": "release signing key", "spaces": [space]}
    ).json()
    prompt = context["messages"][0]["content"]
    assert SECRET in prompt and f"space {space}" in prompt
    assert any(h["space"] == space for h in context["recalled"])

    admin.delete(grant).raise_for_status()
    assert member.post(f"/v1/users/{user}/memories/search", json=search).status_code == 404
    actions = [(e["action"], e["target"].get("space")) for e in admin.get("/v1/audit").json()["entries"]]
    assert {("grant_space", space), ("revoke_space", space), ("promote_memory", space)} <= set(actions)


def test_a_bad_space_request_is_a_clear_4xx(admin):
    assert admin.post("/v1/spaces", json={"space_id": "no spaces allowed"}).status_code == 422
    assert admin.post("/v1/spaces", json={"space_id": "x" * 200}).status_code == 422
    too_many = {"query": "q", "spaces": [f"s{i}" for i in range(9)]}
    assert admin.post("/v1/users/u1/memories/search", json=too_many).status_code == 422
    assert admin.put("/v1/spaces/whatever/grants/not-a-key", json={"role": "read"}).status_code == 422
    name = _id("team")
    assert admin.post("/v1/spaces", json={"space_id": name}).status_code == 200
    assert admin.post("/v1/spaces", json={"space_id": name}).status_code == 409
    exported = admin.get(f"/v1/spaces/{name}/export")
    assert exported.status_code == 200 and exported.text.splitlines()[-1].startswith('{"type":"end"')
    assert admin.delete(f"/v1/spaces/{name}").json()["details"]["spaces"] == 1


def test_a_session_named_with_a_space_is_memorized_into_it(space, admin, member):
    user, sid = _id("user"), _id("s")
    said = "Team decision: the billing service freezes deploys during month-end close."
    turn = {"user_id": user, "agent_id": "planner", "space": space, "messages": [{"role": "user", "content": said}]}
    assert member.post(f"/v1/sessions/{sid}/messages", json=turn).status_code == 404  # no grant: nothing stored
    admin.put(f"/v1/spaces/{space}/grants/{principal(KEY_TEAM_MEMBER)}", json={"role": "write"}).raise_for_status()
    member.post(f"/v1/sessions/{sid}/messages", json=turn).raise_for_status()
    wait_memorized(member, sid, 1)

    assert member.get(f"/v1/sessions/{sid}/messages").json()["messages"][0]["space"] == space
    shared = [m for m in member.get(f"/v1/spaces/{space}/memories").json() if m["text"] == said]
    assert [(m["agent_id"], m["origin_user"], m["session_id"]) for m in shared] == [("planner", user, sid)]
    assert said not in member.get(f"/v1/users/{user}/memories").text
    member.delete(f"/v1/users/{user}").raise_for_status()
    assert said not in member.get(f"/v1/spaces/{space}/memories").text
