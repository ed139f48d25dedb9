"""The typed client (client/, httpx + pydantic) against the running service: every call typed, the
models equal to the service's OpenAPI document, safe retries, errors as exceptions."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import httpx
import pytest
from agent_memory_client import AsyncMemoryClient, InvalidRequest, MemoryClient, NotFound, RateLimited, Unauthorized, models

from serve_app.core.auth import hash_key

from .conftest import KEY_LOCAL, KEY_RETRY, KEY_TEAM_ADMIN, KEY_TEAM_MEMBER, KEY_TINY, wait_memorized


def _id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _fields(schema: dict, spec: dict) -> tuple[set[str], set[str]]:
    if "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return set(schema.get("properties", {})), set(schema.get("required", []))


def test_the_client_models_are_the_services_schemas(service_url):
    """Same names, same fields, same required fields: the client cannot drift from the API."""
    spec = httpx.get(f"{service_url}/openapi.json").json()
    schemas = spec["components"]["schemas"]
    for model in models.API_MODELS:
        name = model.__name__
        server = next((s for key, s in schemas.items() if key in (name, f"{name}-Input", f"{name}-Output")), None)
        assert server is not None, f"{name} is not a schema of the service"
        client = model.model_json_schema()
        assert set(client["properties"]) == set(server["properties"]), name
        assert set(client.get("required", [])) == set(server.get("required", [])), name


def test_a_conversation_through_the_sync_client(service_url):
    user, session = _id("user"), _id("s")
    with MemoryClient(service_url, api_key=KEY_LOCAL) as memory:
        assert memory.health().status == "ok"
        first = memory.append(session, user, [{"role": "user", "content": "My cat Miso is afraid of the vacuum cleaner."}])
        assert first.seqs == [1] and first.duplicates == [False]
        memory.append(session, user, [models.MessageIn(role="assistant", content="Poor Miso! Try a quieter one.")])
        wait_memorized(httpx.Client(base_url=service_url, headers={"Authorization": f"Bearer {KEY_LOCAL}"}), session, 2)
        info = memory.session(session)
        assert isinstance(info, models.SessionInfo) and info.message_count == 2 and info.user_id == user
        assert [m.content for m in memory.iter_messages(session, page=1)][0].startswith("My cat Miso")
        hits = memory.search(user, "what is the cat afraid of?", top_k=3)
        assert hits and isinstance(hits[0], models.SearchHit) and "vacuum" in hits[0].text
        prompt = memory.context(user, _id("new"), "the cat", max_tokens=1024)
        assert prompt.usage.total_tokens <= prompt.usage.limit and any("Miso" in h.text for h in prompt.recalled)
        assert memory.set_fact(user, "pet", "cat named Miso", "fact").changed
        assert [f.value for f in memory.fact_history(user, "pet")] == ["cat named Miso"]
        added = memory.add_memory(user, "Prefers invoices in EUR.")
        assert added.id in {m.id for m in memory.memories(user)}
        assert memory.delete_memory(user, added.id).deleted
        explained = memory.explain_search(user, "what is the cat afraid of?", top_k=3)
        assert [h.id for h in explained.hits] == [c.id for c in explained.candidates if c.kept][:3]
        assert any(u.user_id == user for u in memory.users(after=user[:-1], limit=500).users)
        assert memory.audit(limit=1).entries[0].target == {"user_id": user, "memory_id": added.id}
        assert memory.stats().recall.samples >= 1
        assert [m.seq for m in memory.export_session(session).messages] == [1, 2]
        with pytest.raises(NotFound) as missing:
            memory.delete_memory(user, added.id)
        assert missing.value.status_code == 404 and missing.value.detail == "memory not found"
        assert memory.delete_session(session).deleted


def test_a_users_memory_moves_between_users_through_the_client(service_url):
    """Export, import into another user (the session takes an id of its own), import again (nothing
    new), and an archive cut off in transit is refused whole."""
    user, session, target = _id("user"), _id("s"), _id("user")
    with MemoryClient(service_url, api_key=KEY_LOCAL) as memory:
        memory.append(session, user, [{"role": "user", "content": "My kayak is a green Prijon from 2011."}])
        memory.set_fact(user, "boat", "green Prijon kayak", "fact")
        archive = memory.export_user(user)
        lines = archive.splitlines()
        assert json.loads(lines[0])["type"] == "archive" and json.loads(lines[-1])["counts"]["messages"] == 1
        report = memory.import_user(target, archive)
        (stored,) = report.sessions
        assert report.renamed == {session: stored} and report.messages_added == 1 and report.facts_added == 1
        assert memory.import_user(target, archive).model_dump(exclude={"renamed", "sessions"}) == {
            "user_id": target, "messages_added": 0, "memories_written": 0, "facts_added": 0}  # fmt: skip
        wait_memorized(memory.http, stored, 1)
        assert "Prijon" in memory.search(target, "what kayak do I have?", top_k=1)[0].text
        assert [f.value for f in memory.facts(target)] == ["green Prijon kayak"]
        imports = [e for e in memory.audit(limit=50).entries if e.action == "import_user" and e.target["user_id"] == target]
        assert len(imports) == 2 and imports[-1].result == {"messages": 1, "memories": 0, "facts": 1}
        with pytest.raises(InvalidRequest, match="without its 'end' line"):
            memory.import_user(_id("user"), "\n".join(lines[:-1]))


async def test_the_async_client_and_client_side_ids(service_url):
    user, session = _id("user"), _id("s")
    async with AsyncMemoryClient(service_url, api_key=KEY_LOCAL) as memory:
        turns = [models.MessageIn(role="user", content=f"async turn {i}") for i in range(3)]
        stored = await asyncio.gather(*(memory.append(session, user, [t]) for t in turns))
        assert sorted(s.seqs[0] for s in stored) == [1, 2, 3]
        assert (await memory.session(session)).message_count == 3
        assert (await memory.set_fact(user, "lang", "Go", "preference")).fact.value == "Go"


def test_a_retried_append_is_stored_once(service_url):
    """The first response is lost on the way back (the service stored the turn): the client's retry
    sends the same message ids and the service answers with the original seq."""
    lost = []

    class LoseFirstAnswer(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            response = super().handle_request(request)
            if request.method == "POST" and not lost:
                lost.append(response.read())
                raise httpx.ReadTimeout("response lost", request=request)
            return response

    user, session = _id("user"), _id("s")
    http = httpx.Client(base_url=service_url, transport=LoseFirstAnswer(), headers={"Authorization": f"Bearer {KEY_LOCAL}"})
    with MemoryClient(http=http) as memory:
        result = memory.append(session, user, [{"role": "user", "content": "stored once, whatever the network"}])
        assert lost and result.duplicates == [True] and result.seqs == [1]
        assert memory.session(session).message_count == 1


def test_429_is_retried_after_retry_after_and_errors_carry_status_and_detail(service_url):
    user, session = _id("user"), _id("s")
    with MemoryClient(service_url, api_key=KEY_RETRY, max_retry_wait_s=5) as memory:
        memory.append(session, user, [{"role": "user", "content": f"burst {i}"} for i in range(60)])  # the minute's worth
        started = time.monotonic()
        assert memory.append(session, user, [{"role": "user", "content": "one more"}]).seqs == [61]
        assert time.monotonic() - started >= 0.5  # waited for the allowance the 429 named
    with MemoryClient(service_url, api_key=KEY_TINY) as small, pytest.raises(RateLimited) as quota:
        for i in range(5):
            small.add_memory(_id("u"), f"memory number {i}")  # a quota's Retry-After (an hour) is not waited for
    assert quota.value.status_code == 429 and "quota" in quota.value.detail and quota.value.headers["retry-after"]
    with MemoryClient(service_url, api_key="not-a-key", max_retries=0) as stranger, pytest.raises(Unauthorized):
        stranger.facts("anyone")


def test_langchain_history_and_retriever(service_url):
    from agent_memory_client.langchain import MemoryChatHistory, MemoryRetriever
    from langchain_core.messages import AIMessage, HumanMessage

    user, session = _id("user"), _id("s")
    with MemoryClient(service_url, api_key=KEY_LOCAL) as memory:
        history = MemoryChatHistory(memory, session_id=session, user_id=user)
        assert history.messages == []
        history.add_messages([HumanMessage("My locker code is 4417."), AIMessage("Noted: 4417.")])
        assert [(type(m), m.content) for m in history.messages] == [
            (HumanMessage, "My locker code is 4417."),
            (AIMessage, "Noted: 4417."),
        ]
        wait_memorized(httpx.Client(base_url=service_url, headers={"Authorization": f"Bearer {KEY_LOCAL}"}), session, 2)
        documents = MemoryRetriever(client=memory, user_id=user, top_k=2).invoke("what is the locker code?")
        assert documents and "4417" in documents[0].page_content and documents[0].metadata["session_id"] == session
        history.clear()
        assert history.messages == []


def test_a_team_shares_a_memory_space_through_the_client_and_langchain(service_url):
    """The typed client's space calls, and LangChain's history writing into a space and retriever
    reading it, under a member key the admin granted write."""
    from agent_memory_client.langchain import MemoryChatHistory, MemoryRetriever
    from langchain_core.messages import HumanMessage

    space, user, session = _id("team"), _id("user"), _id("s")
    member_key = "key:" + hash_key(KEY_TEAM_MEMBER)[:12]
    admin, member = MemoryClient(service_url, api_key=KEY_TEAM_ADMIN), MemoryClient(service_url, api_key=KEY_TEAM_MEMBER)
    with admin, member:
        assert admin.create_space(space).role == "admin"
        with pytest.raises(NotFound):
            member.search(user, "anything", spaces=[space])
        assert admin.grant(space, member_key, "write").role == "write"
        assert [(s.space_id, s.role) for s in member.spaces() if s.space_id == space] == [(space, "write")]
        member.add_space_memory(space, "Incident reviews happen on Thursdays at 15:00.", agent_id="scribe")
        own = member.add_memory(user, "I prefer reviews in the afternoon.")
        copy = member.promote_memory(user, own.id, space)
        assert (copy.origin_user, copy.origin_memory) == (user, own.id)

        history = MemoryChatHistory(member, session_id=session, user_id=user, space=space, agent_id="planner")
        history.add_messages([HumanMessage("Decision: the on-call handover is at 09:00 CET.")])
        wait_memorized(httpx.Client(base_url=service_url, headers={"X-API-Key": KEY_TEAM_MEMBER}), session, 1)
        shared = {m.text: m for m in member.space_memories(space)}
        assert shared["Decision: the on-call handover is at 09:00 CET."].agent_id == "planner"

        retriever = MemoryRetriever(client=member, user_id=_id("other-user"), top_k=3, spaces=[space])
        documents = retriever.invoke("when is the on-call handover?")
        assert "09:00 CET" in documents[0].page_content and documents[0].metadata["space"] == space
        assert [h.space for h in member.search(user, "when are incident reviews?", spaces=[space])][:1] == [space]
        assert admin.delete_space(space).details["spaces"] == 1
