"""The HTTP API v1 end to end through Ray Serve, against real Redis, PostgreSQL and Milvus."""

from __future__ import annotations

import asyncio
import re
import uuid

import httpx

from serve_app.core.compression import extract_key_items
from serve_app.core.tokenizer import count_chat
from serve_app.errors import SessionNotFound
from serve_app.stores.session_log import SessionLog

from .conftest import KEY_LOCAL, wait_memorized


def _sid(prefix: str = "s") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def test_health_docs_and_request_id(client):
    health = client.get("/healthz")
    assert health.status_code == 200
    assert health.json()["backends"] == {"redis": "ok", "postgres": "ok", "milvus": "ok"}
    assert health.headers["x-request-id"]
    assert client.get("/docs").status_code == 200
    spec = client.get("/openapi.json").json()
    assert "/v1/context" in spec["paths"] and "/v1/users/{user_id}/memories/search" in spec["paths"]
    assert client.get("/healthz", headers={"x-request-id": "abc123"}).headers["x-request-id"] == "abc123"


def test_three_turn_conversation_and_session_endpoints(client):
    sid, user = _sid(), _sid("user")
    turns = [
        {"role": "user", "content": "I need to change the delivery address of order ORD-7731.", "id": "c1"},
        {"role": "assistant", "content": "Sure. What is the new address for ORD-7731?", "id": "c2"},
        {"role": "user", "content": "12 Rue de la Paix, Paris, before 2024-06-01 please.", "id": "c3"},
    ]
    r = client.post(f"/v1/sessions/{sid}/messages", json={"user_id": user, "messages": turns})
    assert r.status_code == 200, r.text
    assert r.json()["seqs"] == [1, 2, 3]
    retry = client.post(f"/v1/sessions/{sid}/messages", json={"user_id": user, "messages": turns[2:]})
    assert retry.json() == {"session_id": sid, "seqs": [3], "duplicates": [True]}
    other = client.post(f"/v1/sessions/{sid}/messages", json={"user_id": "mallory", "messages": turns[:1]})
    assert other.status_code == 409 and other.json()["detail"]

    info = wait_memorized(client, sid, 3)
    assert info["user_id"] == user and info["message_count"] == 3
    page = client.get(f"/v1/sessions/{sid}/messages", params={"after": 1, "limit": 1}).json()
    assert [m["seq"] for m in page["messages"]] == [2] and page["next_after"] == 2
    sessions = client.get(f"/v1/users/{user}/sessions").json()["sessions"]
    assert [s["session_id"] for s in sessions] == [sid]

    ctx = client.post(
        "/v1/context",
        json={
            "user_id": user,
            "session_id": sid,
            "query": "new address",
            "system_prompt": "You are a support agent.",
            "max_tokens": 1024,
        },
    )
    assert ctx.status_code == 200, ctx.text
    body = ctx.json()
    assert [m["content"] for m in body["messages"][1:]] == [t["content"] for t in turns]
    assert body["usage"]["total_tokens"] == count_chat(body["messages"], add_generation_prompt=True)
    assert body["included_seqs"] == [1, 2, 3]


def test_recall_across_sessions_and_memories_api(client):
    user = _sid("user")
    old = _sid()
    client.post(
        f"/v1/sessions/{old}/messages",
        json={"user_id": user, "messages": [{"role": "user", "content": "My dog Rex is allergic to chicken."}]},
    ).raise_for_status()
    wait_memorized(client, old, 1)
    added = client.post(f"/v1/users/{user}/memories", json={"text": "Prefers invoices in EUR."})
    assert added.status_code == 200
    hits = client.post(f"/v1/users/{user}/memories/search", json={"query": "what food can the dog eat?", "top_k": 5}).json()
    assert hits[0]["text"] == "My dog Rex is allergic to chicken." and hits[0]["session_id"] == old
    scores = [h["score"] for h in hits]  # the second stage's probabilities, best first
    assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)
    assert client.post(f"/v1/users/{_sid('stranger')}/memories/search", json={"query": "dog", "top_k": 5}).json() == []

    new = _sid()
    client.post(f"/v1/sessions/{new}/messages", json={"user_id": user, "messages": [{"role": "user", "content": "hi"}]})
    ctx = client.post("/v1/context", json={"user_id": user, "session_id": new, "query": "dog food", "max_tokens": 2048}).json()
    assert any("Rex" in m["text"] for m in ctx["recalled"])
    assert "Rex is allergic" in ctx["messages"][0]["content"]

    listed = client.get(f"/v1/users/{user}/memories").json()
    assert {m["kind"] for m in listed} == {"turn", "memory"}
    memory_id = added.json()["id"]
    assert client.delete(f"/v1/users/{user}/memories/{memory_id}").status_code == 200
    assert client.delete(f"/v1/users/{user}/memories/{memory_id}").status_code == 404


def test_context_fills_the_room_with_what_passes_the_floors(client):
    """A fresh session leaves the room its history share would take: relevant memories fill it, past
    the memory share and past eight; a question about something else gets none."""
    user, old, new = _sid("user"), _sid(), _sid()
    notes = [
        {"role": "user", "content": f"Trip note {i}: we hiked the {name} trail with the dog and camped by the lake."}
        for i, name in enumerate(["Alder", "Birch", "Cedar", "Dune", "Elm", "Fern", "Glen", "Heath", "Iris", "Juniper",
                                  "Kestrel", "Larch", "Maple", "Nettle", "Oak", "Pine", "Quail", "Rowan", "Sage", "Thistle"])
    ]  # fmt: skip
    client.post(f"/v1/sessions/{old}/messages", json={"user_id": user, "messages": notes}).raise_for_status()
    wait_memorized(client, old, len(notes))
    client.post(f"/v1/sessions/{new}/messages", json={"user_id": user, "messages": [{"role": "user", "content": "hi"}]})

    def context(query: str, **extra) -> dict:
        response = client.post(
            "/v1/context", json={"user_id": user, "session_id": new, "query": query, "max_tokens": 2048, **extra}
        )
        assert response.status_code == 200, response.text
        return response.json()

    hiking = context("which trails did we hike with the dog?")
    memory = hiking["usage"]["sections"]["memory"]
    assert len(hiking["recalled"]) == len(notes) and memory["reason"] == "all_fit"
    assert memory["tokens"] > memory["share"] == int(2048 * 0.12) and memory["budget"] > memory["share"]
    assert all(n["content"] in hiking["messages"][0]["content"] for n in notes)
    assert len(re.findall(r"^\[\d{4}-\d{2}-\d{2}\]$", hiking["messages"][0]["content"], re.MULTILINE)) == 1  # one date header
    assert len(context("which trails did we hike with the dog?", top_k=3)["recalled"]) == 3  # the caller's cap

    unrelated = context("What is the boiling point of mercury?")
    assert unrelated["recalled"] == [] and unrelated["usage"]["sections"]["memory"]["reason"] == "empty"
    refused = client.post("/v1/context", json={"user_id": user, "session_id": new, "shares": {"system": 0.1}})
    assert refused.status_code == 422 and "shares.system is not a share" in refused.text


def test_context_leaves_out_memories_the_second_stage_finds_unlikely(client):
    """The probability floor: a memory enters the prompt only when the second stage gives it at least
    `min_probability` of answering the query; 0 keeps all that passed the other floors."""
    user, old, new = _sid("user"), _sid(), _sid()
    notes = [
        {"role": "user", "content": "My sister Ana lives in Porto and teaches chemistry."},
        {"role": "user", "content": "Ana's school is the Liceu Garcia de Orta in Porto."},
        {"role": "user", "content": "We visited Porto in May and ate francesinha by the river."},
        {"role": "user", "content": "The chemistry olympiad is in June; Ana coaches the team."},
        {"role": "user", "content": "My car needs new tyres before the trip to Porto."},
        {"role": "user", "content": "I teach my kids chess on Sundays."},
    ]
    client.post(f"/v1/sessions/{old}/messages", json={"user_id": user, "messages": notes}).raise_for_status()
    wait_memorized(client, old, len(notes))

    def recalled(**extra) -> list[dict]:
        body = {"user_id": user, "session_id": new, "query": "Where does my sister teach chemistry?", **extra}
        response = client.post("/v1/context", json=body)
        assert response.status_code == 200, response.text
        return response.json()["recalled"]

    everything = recalled(min_probability=0)
    scores = sorted({hit["score"] for hit in everything})
    assert len(scores) >= 3, everything
    floor = scores[len(scores) // 2]
    kept = recalled(min_probability=floor)
    assert [h["id"] for h in kept] == [h["id"] for h in everything if h["score"] >= floor]
    assert 0 < len(kept) < len(everything)
    assert all(hit["score"] >= 0.001 for hit in recalled())  # the shipped floor, context_min_probability
    refused = client.post("/v1/context", json={"user_id": user, "session_id": new, "min_probability": 1.5})
    assert refused.status_code == 422 and "min_probability" in refused.text


def test_facts_supersede_and_keep_history(client):
    user = _sid("user")
    assert client.put(f"/v1/users/{user}/facts/language", json={"value": "Python", "category": "preference"}).json()["changed"]
    client.put(f"/v1/users/{user}/facts/language", json={"value": "Go", "category": "preference"}).raise_for_status()
    assert client.get(f"/v1/users/{user}/facts/language").json()["value"] == "Go"
    history = client.get(f"/v1/users/{user}/facts/language/history").json()
    assert [h["value"] for h in history] == ["Python", "Go"] and history[0]["valid_to"]
    assert client.delete(f"/v1/users/{user}/facts/language").status_code == 200
    assert client.get(f"/v1/users/{user}/facts/language").status_code == 404
    assert len(client.get(f"/v1/users/{user}/facts/language/history").json()) == 2
    assert client.put(f"/v1/users/{user}/facts/x", json={"value": "v", "category": "gossip"}).status_code == 422


def test_delete_session_removes_log_and_vectors(client):
    sid, user = _sid(), _sid("user")
    client.post(f"/v1/sessions/{sid}/messages", json={"user_id": user, "messages": [{"role": "user", "content": "secret plan"}]})
    wait_memorized(client, sid, 1)
    assert client.get(f"/v1/users/{user}/memories").json()
    deleted = client.delete(f"/v1/sessions/{sid}")
    assert deleted.status_code == 200 and deleted.json()["details"]["vectors"] >= 1
    assert client.get(f"/v1/sessions/{sid}").status_code == 404
    assert client.get(f"/v1/users/{user}/memories").json() == []
    assert client.delete(f"/v1/sessions/{sid}").status_code == 404


def test_bad_input_is_a_clear_4xx(client):
    sid = _sid()
    cases = [
        ("post", f"/v1/sessions/{sid}/messages", {"user_id": "u", "messages": [{"role": "wizard", "content": "x"}]}),
        (
            "post",
            f"/v1/sessions/{sid}/messages",
            {"user_id": 'x" or user_id != "', "messages": [{"role": "user", "content": "x"}]},
        ),
        ("post", f"/v1/sessions/{sid}/messages", {"user_id": "u", "messages": []}),
        ("post", f"/v1/sessions/{sid}/messages", {"user_id": "u", "messages": [{"role": "user", "content": "x"}] * 101}),
        ("post", "/v1/sessions/bad%20id/messages", {"user_id": "u", "messages": [{"role": "user", "content": "x"}]}),
        ("post", "/v1/context", {"user_id": "u", "session_id": sid, "max_tokens": 10}),
        ("post", "/v1/context", {"user_id": "u", "session_id": sid, "shares": {"system": 0.9, "history": 0.9}}),
        ("post", "/v1/users/u/memories/search", {"query": "x", "top_k": 10_000}),
    ]
    for method, path, body in cases:
        r = getattr(client, method)(path, json=body)
        assert 400 <= r.status_code < 500, (path, body, r.status_code, r.text)
        assert r.json()["detail"], r.text
    client.post(f"/v1/sessions/{sid}/messages", json={"user_id": "u", "messages": [{"role": "user", "content": "word " * 3000}]})
    too_big = client.post("/v1/context", json={"user_id": "u", "session_id": sid, "max_tokens": 1024})
    assert too_big.status_code == 422 and too_big.json()["token_counts"]["newest_turn"] > 1024
    assert client.get(f"/v1/sessions/{sid}/messages").json()["messages"]  # a refused read lost nothing


def test_200_turn_session_fits_2048_tokens(client):
    sid, user = _sid(), _sid("user")
    turns = []
    for i in range(200):
        role = "user" if i % 2 == 0 else "assistant"
        # A support dialog: a handful of orders, dates and amounts come up again and again.
        content = f"About order ORD-{5000 + i % 15}: it ships on 2024-07-{i % 10 + 1:02d} and costs ${i % 12}.99, right?"
        turns.append({"role": role, "content": content, "id": f"t{i}"})
    for start in range(0, 200, 50):
        client.post(
            f"/v1/sessions/{sid}/messages", json={"user_id": user, "messages": turns[start : start + 50]}
        ).raise_for_status()
    info = wait_memorized(client, sid, 200)
    assert info["covers_upto_seq"] > 0  # the memorizer compacted past the trigger

    body = client.post("/v1/context", json={"user_id": user, "session_id": sid, "query": "ORD-5007", "max_tokens": 2048}).json()
    messages = body["messages"]
    reserve = body["usage"]["reserve_output"]
    assert count_chat(messages, add_generation_prompt=True) <= 2048 - reserve
    summary = client.get(f"/v1/sessions/{sid}/messages", params={"limit": 1}).json()["summary"]
    assert summary and summary in messages[0]["content"]
    assert messages[-1]["content"] == turns[-1]["content"]
    covered = set(range(1, info["covers_upto_seq"] + 1))
    present = set(body["included_seqs"])
    assert covered | present == set(range(1, 201))
    assert body["usage"]["omitted_turns"] == 0
    assert "summary_truncated" not in body["degraded"]
    for turn in turns[: info["covers_upto_seq"]]:  # what left the prompt kept its ids, dates and amounts
        for item in extract_key_items(turn["content"]):
            assert item in summary, item


async def _hammer(base_url: str, sid: str, user: str, writers: int, per_writer: int, compressors: int):
    """`writers` clients append `per_writer` messages each into one session while `compressors` compact it.

    Every 10th message is sent again once acknowledged, as a client whose response got lost would: alone, or
    batched with the writer's next message. Returns each writer's acknowledged seqs, what each retry got
    back, and the compare-and-set conflicts the compressors lost."""
    conflicts = 0
    done = asyncio.Event()
    acked: dict[int, list[int]] = {}
    retried: list[tuple[int, int, int, bool]] = []  # (writer, message, seq answered to the retry, duplicate)
    async with httpx.AsyncClient(
        base_url=base_url,
        timeout=60,
        headers={"Authorization": f"Bearer {KEY_LOCAL}"},
        limits=httpx.Limits(max_connections=writers + compressors),
    ) as http:

        async def append(messages: list[dict]) -> dict:
            r = await http.post(f"/v1/sessions/{sid}/messages", json={"user_id": user, "messages": messages})
            r.raise_for_status()
            return r.json()

        async def writer(w: int):
            msgs = [
                {
                    "role": "user" if i % 2 == 0 else "assistant",
                    "content": f"writer {w} message {i} ref W{w}-{i}",
                    "id": f"w{w}-{i}",
                }
                for i in range(per_writer)
            ]
            seqs = acked[w] = []
            i = 0
            while i < per_writer:
                body = await append([msgs[i]])
                assert body["duplicates"] == [False], body
                seqs += body["seqs"]
                if i % 10 == 9:  # a retry of the acknowledged write
                    if i % 20 == 19 and i + 1 < per_writer:  # ... batched with the next message
                        body = await append([msgs[i], msgs[i + 1]])
                        assert body["duplicates"] == [True, False], body
                        retried.append((w, i, body["seqs"][0], True))
                        seqs.append(body["seqs"][1])
                        i += 1
                    else:
                        body = await append([msgs[i]])
                        retried.append((w, i, body["seqs"][0], body["duplicates"][0]))
                i += 1

        async def compressor():
            nonlocal conflicts
            while not done.is_set():
                r = await http.post(f"/v1/sessions/{sid}/compress")
                if r.status_code == 200:
                    conflicts += r.json()["cas_conflicts"]
                elif r.status_code not in (404, 409):
                    raise AssertionError(r.text)
                await asyncio.sleep(0)

        compress_tasks = [asyncio.create_task(compressor()) for _ in range(compressors)]
        try:
            await asyncio.gather(*(writer(w) for w in range(writers)))
        finally:
            done.set()
            await asyncio.gather(*compress_tasks)
    return acked, retried, conflicts


def _pages(client, path: str, key: str | None, limit: int = 1000, **params) -> list[dict]:
    """Every row of a paged listing: `after`/`next_after` for the log, `offset` for memories."""
    rows: list[dict] = []
    while True:
        if key is None:  # offset paging
            page = client.get(path, params={"limit": limit, "offset": len(rows), **params}).json()
            rows += page
            if len(page) < limit:
                return rows
        else:
            body = client.get(path, params={"limit": limit, **params}).json()
            rows += body[key]
            if body["next_after"] is None:
                return rows
            params["after"] = body["next_after"]


def test_concurrent_clients_and_compressions_lose_nothing(client, service_url):
    """32 writers x 100 messages into one session while it is compacted and memorized: each message is
    stored exactly once in its writer's order, seqs are gapless, a retried id gets its original seq back,
    and the memorizer catches up with one memory per message."""
    sid, user = _sid(), _sid("user")
    writers, per_writer = 32, 100
    total = writers * per_writer
    acked, retried, conflicts = asyncio.run(_hammer(service_url, sid, user, writers, per_writer, compressors=4))

    rows = _pages(client, f"/v1/sessions/{sid}/messages", "messages", after=0)
    assert [m["seq"] for m in rows] == list(range(1, total + 1))  # gapless
    by_id = {m["id"]: m["seq"] for m in rows}
    assert len(by_id) == total  # nothing stored twice
    for w in range(writers):
        mine = [m for m in rows if m["id"].startswith(f"w{w}-")]
        assert [int(m["id"].split("-")[1]) for m in mine] == list(range(per_writer))  # each writer's order kept
        assert [m["seq"] for m in mine] == acked[w]  # what was acknowledged is what was stored
    assert len(retried) == writers * per_writer // 10
    for w, i, seq, duplicate in retried:
        assert duplicate and seq == by_id[f"w{w}-{i}"], (w, i, seq, duplicate)  # the original seq, not a new one

    info = client.get(f"/v1/sessions/{sid}").json()
    covers = info["covers_upto_seq"]
    assert 0 < covers < total
    tail = _pages(client, f"/v1/sessions/{sid}/messages", "messages", after=covers)
    assert [m["seq"] for m in tail] == list(range(covers + 1, total + 1))  # summary + tail cover each seq once
    assert conflicts > 0, "the test must show concurrent compactions racing"
    summary = client.get(f"/v1/sessions/{sid}/messages", params={"limit": 1}).json()["summary"]
    assert summary.startswith("Earlier conversation, turns 1-")

    info = wait_memorized(client, sid, total, timeout_s=120)
    assert info["memorized_upto_seq"] == total and info["message_count"] == total
    memories = [m for m in _pages(client, f"/v1/users/{user}/memories", None) if m["kind"] != "summary"]
    assert sorted(m["seq"] for m in memories) == list(range(1, total + 1))  # one memory per message
    assert len({m["id"] for m in memories}) == total
    text = {m["seq"]: m["content"] for m in rows}
    assert all(m["session_id"] == sid and m["kind"] == "turn" and m["text"] == text[m["seq"]] for m in memories)


def test_a_lost_poke_only_delays_memorization(client, backends):
    """Turns written straight to Redis (no poke at all) are memorized by the sweep."""
    sid, user = _sid(), _sid("user")

    async def write():
        log = SessionLog(backends.env["REDIS_URL"], 3600)
        await log.append(
            "local", sid, user, [{"role": "user", "content": "written without a poke", "created_at": "2024-01-01T00:00:00+00:00"}]
        )
        await log.close()

    asyncio.run(write())
    assert wait_memorized(client, sid, 1)["memorized_upto_seq"] == 1


def test_a_memory_page_past_the_listing_window_is_a_422(client):
    """Milvus lists no row past offset + limit 16,384 (a server answers an error, which was a 503):
    a page beyond that is refused with a message, and the last page inside it is served."""
    user = f"window-{uuid.uuid4().hex[:8]}"
    beyond = client.get(f"/v1/users/{user}/memories", params={"limit": 100, "offset": 16300})
    assert beyond.status_code == 422 and "16384" in beyond.json()["detail"]
    assert client.get(f"/v1/users/{user}/memories", params={"limit": 84, "offset": 16300}).json() == []


async def test_a_compaction_the_memorizer_refuses_is_its_answer_not_a_failed_request(service_url):
    """A refusal (the session gone: 404; every compare-and-set race lost: 409) comes back from the
    Memorizer as its answer, which the Ingress raises: raised in the Memorizer's method, Serve would
    log it as a failed request with a traceback and count it in the deployment's errors."""
    from ray import serve

    memorizer = serve.get_deployment_handle("Memorizer", app_name="memserve")
    refused = await memorizer.compress.remote("local", f"gone-{uuid.uuid4().hex}")
    assert isinstance(refused, SessionNotFound) and refused.status_code == 404
