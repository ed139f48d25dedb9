"""MCP at /mcp with the official `mcp` client SDK over streamable HTTP: the tools, their limits and
the tenant of the API key, against the running service."""

from __future__ import annotations

import json
import uuid

import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from serve_app.core.auth import hash_key

from .conftest import KEY_B, KEY_LOCAL, KEY_TEAM_ADMIN, KEY_TEAM_MEMBER, wait_memorized

TOOLS = {
    "search_memory", "add_memory", "delete_memory", "get_context", "append_messages", "list_facts", "set_fact",
    "export_memory", "import_memory", "list_spaces", "add_space_memory", "promote_memory", "promote_fact",
}  # fmt: skip


def _id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class Tools:
    """One MCP session per call of `run`: list, call, read the structured result."""

    def __init__(self, url: str, key: str | None):
        self.url = f"{url}/mcp"
        self.headers = {"X-API-Key": key} if key else {}

    async def run(self, calls: list[tuple[str, dict]]) -> tuple[set[str], list]:
        async with (
            httpx2.AsyncClient(headers=self.headers, timeout=httpx2.Timeout(60)) as http,
            streamable_http_client(self.url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            names = {tool.name for tool in (await session.list_tools()).tools}
            results = [await session.call_tool(name, arguments) for name, arguments in calls]
        return names, results


def _data(result):
    assert not result.is_error, result.content
    if result.structured_content is not None:
        return result.structured_content.get("result", result.structured_content)
    return json.loads(result.content[0].text)


async def test_tools_are_listed_and_each_one_works(service_url):
    user, session = _id("user"), _id("s")
    tools = Tools(service_url, KEY_LOCAL)
    names, results = await tools.run(
        [
            ("append_messages", {"session_id": session, "user_id": user, "messages": [
                {"role": "user", "content": "My bike is a blue Bianchi from 1998.", "id": "m1"}]}),
            ("add_memory", {"user_id": user, "text": "Allergic to penicillin."}),
            ("set_fact", {"user_id": user, "key": "bike", "value": "blue Bianchi", "category": "fact"}),
            ("list_facts", {"user_id": user}),
        ]
    )  # fmt: skip
    assert names == TOOLS
    appended, added, written, facts = (_data(r) for r in results)
    assert appended["seqs"] == [1] and written["changed"] and [f["key"] for f in facts] == ["bike"]
    wait_memorized(httpx.Client(base_url=service_url, headers={"X-API-Key": KEY_LOCAL}), session, 1)

    _, results = await tools.run(
        [
            ("search_memory", {"user_id": user, "query": "what bike?", "top_k": 3}),
            ("get_context", {"user_id": user, "session_id": _id("s"), "query": "medicine", "max_tokens": 1024}),
            ("delete_memory", {"user_id": user, "memory_id": added["id"]}),
            ("delete_memory", {"user_id": user, "memory_id": added["id"]}),
            ("search_memory", {"user_id": "not a valid id!", "query": "x"}),
            ("append_messages", {"session_id": session, "user_id": user, "messages": []}),
            ("add_memory", {"user_id": user, "text": "x" * 8193}),
            ("search_memory", {"user_id": user, "query": "bike", "top_k": 101}),
            ("get_context", {"user_id": user, "session_id": _id("s"), "max_tokens": 255}),
            ("set_fact", {"user_id": user, "key": "bike", "value": "red", "category": "colour"}),
        ]
    )
    hits, context, deleted = (_data(r) for r in results[:3])
    assert "Bianchi" in hits[0]["text"]
    assert context["usage"]["total_tokens"] <= context["usage"]["limit"] and "penicillin" in context["messages"][0]["content"]
    assert deleted["deleted"]
    refused = [r.content[0].text for r in results[3:]]
    assert [r.is_error for r in results[3:]] == [True] * len(refused), refused
    assert "404: memory not found" in refused[0]  # the API's status and message
    # The REST models' own limits, field by field: id pattern, list and text lengths, bounds, enums.
    limits = ["pattern", "at least 1 item", "at most 8192", "less than or equal to 100", "greater than or equal to 256",
              "'preference', 'fact', 'decision', 'task' or 'instruction'"]  # fmt: skip
    for text, limit in zip(refused[1:], limits, strict=True):
        assert limit in text, text


async def test_a_users_memory_moves_through_the_archive_tools(service_url):
    user, session, target = _id("user"), _id("s"), _id("user")
    tools = Tools(service_url, KEY_LOCAL)
    await tools.run(
        [
            ("append_messages", {"session_id": session, "user_id": user, "messages": [
                {"role": "user", "content": "The shed key hangs behind the calendar."}]}),
            ("set_fact", {"user_id": user, "key": "shed_key", "value": "behind the calendar", "category": "fact"}),
        ]
    )  # fmt: skip
    exports = [("export_memory", {"user_id": user}), ("export_memory", {"user_id": user, "vectors": False})]
    _, (exported, light) = await tools.run(exports)
    archive = _data(exported)
    headers = [json.loads(text.splitlines()[0]) for text in (archive, _data(light))]
    assert [h["vectors"] for h in headers] == [True, False]
    imports = [("import_memory", {"user_id": target, "archive": text}) for text in (archive, archive[:-30])]
    _, (imported, cut) = await tools.run(imports)
    report = _data(imported)
    assert report["messages_added"] == 1 and report["facts_added"] == 1 and list(report["renamed"]) == [session]
    assert cut.is_error and "422: not an archive this service reads" in cut.content[0].text


@pytest.mark.parametrize("key", [None, "wrong-key-0123456789"])
async def test_a_missing_or_wrong_key_is_refused(service_url, key):
    response = httpx.post(
        f"{service_url}/mcp",
        headers={"Accept": "application/json, text/event-stream"} | ({"X-API-Key": key} if key else {}),
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
    )
    assert response.status_code == 401 and response.json() == {"detail": "missing or invalid API key"}
    with pytest.raises(BaseExceptionGroup) as refused:  # the SDK cannot even initialize a session
        await Tools(service_url, key).run([])
    assert "MCPError" in repr(refused.value.exceptions)


async def test_another_tenant_never_sees_the_data(service_url):
    user = _id("user")
    await Tools(service_url, KEY_LOCAL).run([("set_fact", {"user_id": user, "key": "secret", "value": "42"})])
    _, results = await Tools(service_url, KEY_B).run(
        [("list_facts", {"user_id": user}), ("search_memory", {"user_id": user, "query": "42"})]
    )
    assert _data(results[0]) == [] and _data(results[1]) == []


async def test_spaces_through_the_tools_and_no_grant_no_space(service_url):
    """An admin shares memory through the tools; a key of the same tenant without a grant reaches
    nothing of the space by any tool, and with a read grant reads it beside a user's memory."""
    space, user = _id("team"), _id("user")
    admin = httpx.Client(base_url=service_url, headers={"X-API-Key": KEY_TEAM_ADMIN})
    admin.post("/v1/spaces", json={"space_id": space}).raise_for_status()
    _, results = await Tools(service_url, KEY_TEAM_ADMIN).run(
        [
            ("add_space_memory", {"space": space, "text": "The VPN gateway is vpn-7.corp.", "agent_id": "it-bot"}),
            ("add_memory", {"user_id": user, "text": "I reset my VPN token on Monday."}),
            ("set_fact", {"user_id": user, "key": "laptop", "value": "ThinkPad X1"}),
            ("list_spaces", {}),
        ]
    )
    shared, mine, _, listed = (_data(r) for r in results)
    assert shared["agent_id"] == "it-bot" and space in [s["space_id"] for s in listed]
    calls = [
        ("search_memory", {"user_id": user, "query": "which VPN gateway?", "spaces": [space]}),
        ("get_context", {"user_id": user, "session_id": _id("s"), "query": "VPN gateway", "spaces": [space]}),
        ("add_space_memory", {"space": space, "text": "injected"}),
        ("promote_memory", {"user_id": user, "memory_id": mine["id"], "space": space}),
        ("promote_fact", {"user_id": user, "key": "laptop", "space": space}),
        ("append_messages", {"session_id": _id("s"), "user_id": user, "space": space,
                             "messages": [{"role": "user", "content": "x"}]}),
    ]
    names, refused = await Tools(service_url, KEY_TEAM_MEMBER).run([("list_spaces", {}), *calls])
    assert space not in json.dumps(_data(refused[0]))
    for (name, _), result in zip(calls, refused[1:], strict=True):
        assert result.is_error and "404: memory space not found" in result.content[0].text, (name, result.content)

    member = "key:" + hash_key(KEY_TEAM_MEMBER)[:12]
    admin.put(f"/v1/spaces/{space}/grants/{member}", json={"role": "read"}).raise_for_status()
    _, results = await Tools(service_url, KEY_TEAM_MEMBER).run(calls[:3])
    hits, context = _data(results[0]), _data(results[1])
    assert hits[0]["space"] == space and "vpn-7.corp" in context["messages"][0]["content"]
    assert results[2].is_error and "403" in results[2].content[0].text
    admin.delete(f"/v1/spaces/{space}")
