"""The MCP tools as a host shows them to its model: flat arguments, each with a description, and
the REST models' limits (the calls themselves: tests/serve/test_mcp.py)."""

from __future__ import annotations

import pytest

from serve_app.api.mcp_tools import build_mcp
from serve_app.services.dependencies import Dependencies
from serve_app.settings import Settings


async def _never(*_args):
    raise AssertionError("only the tools' schemas are read here")


@pytest.fixture(scope="module")
async def tools() -> dict[str, dict]:
    deps = Dependencies(settings=Settings(), stores=None, embed_one=_never, embed_documents=_never, compact_now=_never)
    return {tool.name: tool.input_schema for tool in await build_mcp(deps).list_tools()}


def _properties(schema: dict):
    """(path, property) of every property of a schema and of its definitions."""
    for name, prop in schema.get("properties", {}).items():
        yield name, prop
    for model, definition in schema.get("$defs", {}).items():
        for name, prop in definition.get("properties", {}).items():
            yield f"{model}.{name}", prop


async def test_arguments_are_the_request_fields_flat(tools):
    assert tools["add_memory"]["properties"].keys() == {"user_id", "text", "id", "created_at", "agent_id"}
    assert tools["add_memory"]["required"] == ["user_id", "text"]
    assert tools["search_memory"]["properties"].keys() == {"user_id", "query", "top_k", "min_score", "explain", "spaces"}
    assert tools["append_messages"]["required"] == ["session_id", "user_id", "messages"]
    fact_fields = {"user_id", "key", "value", "category", "source_session", "source_seqs", "agent_id"}
    assert tools["set_fact"]["properties"].keys() == fact_fields
    nested = [f"{tool}.{name}" for tool, schema in tools.items() for name, prop in schema["properties"].items() if "$ref" in prop]
    assert not nested, nested


async def test_every_argument_and_item_field_is_described(tools):
    undescribed = [
        f"{tool}.{path}" for tool, schema in tools.items() for path, p in _properties(schema) if not p.get("description")
    ]
    assert not undescribed, undescribed


async def test_the_limits_are_the_rest_models(tools):
    text = tools["add_memory"]["properties"]["text"]
    top_k = tools["search_memory"]["properties"]["top_k"]
    messages = tools["append_messages"]["properties"]["messages"]
    assert (text["minLength"], text["maxLength"]) == (1, 8192)
    assert (top_k["minimum"], top_k["maximum"], top_k["default"]) == (1, 100, 10)
    assert (messages["minItems"], messages["maxItems"]) == (1, 100)
    assert tools["set_fact"]["properties"]["category"]["enum"] == ["preference", "fact", "decision", "task", "instruction"]
