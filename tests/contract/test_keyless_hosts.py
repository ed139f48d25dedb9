"""With API keys off (the loopback default) a request must address this machine by a loopback name
or one of `allowed_hosts`: a page whose name was rebound to 127.0.0.1 (DNS rebinding) reaches
neither REST, nor `/mcp`, nor `/ui`. With keys on, the key is the guard and any Host is served."""

from __future__ import annotations

import uuid

import pytest

from serve_app.core.auth import hash_key
from tests.in_process import in_process_client

REBOUND = {"Host": "rebind.attacker.example", "Origin": "http://rebind.attacker.example"}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
KEY = "key-hosts-0123456789"


def _plant(session: str) -> dict:
    """An MCP tools/call that appends one turn (stateless MCP: no initialize needed)."""
    arguments = {"session_id": session, "user_id": "victim", "messages": [{"role": "user", "content": "planted"}]}
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "append_messages", "arguments": arguments}}


async def test_a_rebound_host_reaches_neither_mcp_nor_rest_nor_the_inspector(backends):
    session = f"rebind-{uuid.uuid4().hex[:8]}"
    async with in_process_client(backends, mcp=True) as client:
        planted = await client.post("/mcp", headers=MCP_HEADERS | REBOUND, json=_plant(session))
        read = await client.get(f"/v1/sessions/{session}/messages", headers=REBOUND)
        page = await client.get("/ui", headers=REBOUND)
        stored = await client.get(f"/v1/sessions/{session}")
    for refused in (planted, read, page):
        assert refused.status_code == 421, refused.text
        assert "rebind.attacker.example" in refused.json()["detail"] and "allowed_hosts" in refused.json()["detail"]
    assert stored.status_code == 404, stored.text


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "localhost:8000", "localhost", "[::1]:8000", "LOCALHOST:8000"])
async def test_loopback_names_are_served(backends, host):
    async with in_process_client(backends) as client:
        response = await client.get("/v1/users/nobody/facts", headers={"Host": host, "Origin": f"http://{host}"})
    assert response.status_code == 200, response.text


async def test_a_foreign_origin_on_a_loopback_host_is_refused(backends):
    async with in_process_client(backends) as client:
        response = await client.get("/v1/users/nobody/facts", headers={"Origin": "https://attacker.example"})
        null_origin = await client.get("/v1/users/nobody/facts", headers={"Origin": "null"})
    assert response.status_code == 403 and "attacker.example" in response.json()["detail"]
    assert null_origin.status_code == 403


async def test_allowed_hosts_adds_names_and_mcp_checks_the_same_list(backends):
    session = f"lan-{uuid.uuid4().hex[:8]}"
    lan = {"Host": "memory.lan:8000", "Origin": "http://memory.lan:8000"}
    async with in_process_client(backends, mcp=True, allowed_hosts=["memory.lan"]) as client:
        planted = await client.post("/mcp", headers=MCP_HEADERS | lan, json=_plant(session))
        read = await client.get(f"/v1/sessions/{session}/messages", headers=lan)
        other = await client.get("/v1/users/nobody/facts", headers={"Host": "other.lan"})
    assert planted.status_code == 200 and not planted.json()["result"]["isError"], planted.text
    assert [m["content"] for m in read.json()["messages"]] == ["planted"]
    assert other.status_code == 421


async def test_with_keys_on_any_host_is_served_with_its_key(backends):
    async with in_process_client(backends, api_keys={hash_key(KEY): "hosts"}) as client:
        response = await client.get("/v1/users/nobody/facts", headers=REBOUND | {"X-API-Key": KEY})
    assert response.status_code == 200, response.text
