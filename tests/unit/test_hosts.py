"""The names a keyless service answers to, and the MCP SDK's own check configured with the same."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette

from serve_app.api.mcp_tools import build_mcp, mcp_routes
from serve_app.core.hosts import HostPolicy, host_name
from serve_app.services.dependencies import Dependencies
from serve_app.settings import Settings


@pytest.mark.parametrize(
    ("header", "name"),
    [("127.0.0.1:8000", "127.0.0.1"), ("[::1]:8000", "::1"), ("[::1]", "::1"), ("LocalHost.", "localhost"), ("a.b", "a.b")],
)
def test_host_name_drops_port_brackets_case_and_final_dot(header, name):
    assert host_name(header) == name


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("127.0.0.1:8000", True),
        ("localhost", True),
        ("[::1]:9", True),
        ("memory.lan:8000", True),
        ("127.attacker.example", False),  # starts like a loopback address, resolves wherever its owner says
        ("localhost.attacker.example", False),
        ("", False),
        (None, False),
    ],
)
def test_only_loopback_and_added_names_are_allowed(host, allowed):
    assert HostPolicy(["memory.lan"]).allows_host(host) is allowed


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        (None, True),
        ("http://localhost:5173", True),
        ("https://memory.lan", True),
        ("null", False),
        ("http://evil.example", False),
    ],
)
def test_an_origin_is_judged_by_its_host_name(origin, allowed):
    assert HostPolicy(["memory.lan"]).allows_origin(origin) is allowed


async def _never(*_args):
    raise AssertionError("refused before any tool runs")


@pytest.mark.parametrize(
    ("headers", "status"),
    [({"Host": "rebind.attacker.example"}, 421), ({"Host": "127.0.0.1:8000", "Origin": "http://rebind.attacker.example"}, 403)],
)
async def test_the_mcp_sdk_checks_the_same_names_on_its_own(headers, status):
    """`/mcp` without the app's HostGuard in front: the SDK's rebinding protection still refuses."""
    deps = Dependencies(settings=Settings(), stores=None, embed_one=_never, embed_documents=_never, compact_now=_never)
    mcp = build_mcp(deps)
    app = Starlette(routes=mcp_routes(mcp, deps))
    request = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    async with mcp.session_manager.run(), httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as client:
        response = await client.post(
            "http://127.0.0.1:8000/mcp", json=request, headers={"Accept": "application/json, text/event-stream"} | headers
        )
        allowed = await client.post(
            "http://127.0.0.1:8000/mcp", json=request, headers={"Accept": "application/json, text/event-stream"}
        )
    assert response.status_code == status, response.text
    assert allowed.status_code == 200, allowed.text
