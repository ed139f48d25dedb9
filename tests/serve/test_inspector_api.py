"""What the inspector needs, as public API first: users listing, search with explain, the audit log,
live figures, session export, and the inspector's cookie with its CSRF token on the API itself; then
its pages of memory spaces, read with the signed-in key's grants."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from serve_app.core.auth import hash_key
from serve_app.core.inspector_auth import COOKIE, CSRF_HEADER
from serve_app.settings import Settings

from .conftest import KEY_B, KEY_INSPECT, KEY_TEAM_ADMIN, KEY_TEAM_MEMBER, wait_memorized


def _id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def inspector(service_url):
    with httpx.Client(base_url=service_url, timeout=60, headers={"X-API-Key": KEY_INSPECT}) as c:
        yield c


def _signed_in(service_url: str) -> tuple[str, str]:
    """(cookie, csrf token) of a sign-in through the inspector's form, as a browser gets them."""
    with httpx.Client(base_url=service_url, timeout=60) as browser:
        r = browser.post("/ui/login", data={"api_key": KEY_INSPECT, "next": "/ui/audit"})
        assert r.status_code == 303 and r.headers["location"] == "/ui/audit"
        assert "httponly" in r.headers["set-cookie"].lower() and "samesite=strict" in r.headers["set-cookie"].lower()
        cookie = browser.cookies[COOKIE]
        assert KEY_INSPECT not in cookie and KEY_INSPECT not in r.headers["location"]
        page = browser.get("/ui/confirm/delete_session", params={"session_id": "x"})
        token = page.text.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
        return cookie, token


def test_users_are_listed_by_id_a_page_at_a_time_with_their_counts(inspector, service_url):
    prefix = _id("lu")
    users = [f"{prefix}-{i}" for i in range(5)]
    for user in users[:3]:
        inspector.post(f"/v1/users/{user}/memories", json={"text": f"{user} likes green tea"}).raise_for_status()
    for user in users[2:]:
        inspector.put(f"/v1/users/{user}/facts/drink", json={"value": "tea"}).raise_for_status()
    seen, after = [], prefix
    while True:
        page = inspector.get("/v1/users", params={"after": after, "limit": 2}).json()
        seen += [u for u in page["users"] if u["user_id"].startswith(prefix)]
        assert len(page["users"]) <= 2
        if page["next_after"] is None or not page["next_after"].startswith(prefix):
            break
        after = page["next_after"]
    assert [u["user_id"] for u in seen] == users
    assert [(u["memories"], u["facts"]) for u in seen] == [(1, 0), (1, 0), (1, 1), (0, 1), (0, 1)]
    with httpx.Client(base_url=service_url, timeout=60, headers={"X-API-Key": KEY_B}) as other:
        assert not [
            u
            for u in other.get("/v1/users", params={"after": prefix, "limit": 500}).json()["users"]
            if u["user_id"].startswith(prefix)
        ]
    assert inspector.get("/v1/users", params={"limit": 0}).status_code == 422


def test_search_explain_gives_every_candidates_scores_and_the_floor_that_dropped_it(inspector):
    user = _id("ex")
    for text in ("The flight to Lisbon leaves at 07:40 from gate B12.", "Our cat Miso hates the vacuum cleaner."):
        inspector.post(f"/v1/users/{user}/memories", json={"text": text}).raise_for_status()
    plain = inspector.post(f"/v1/users/{user}/memories/search", json={"query": "when does the Lisbon flight leave"}).json()
    explained = inspector.post(
        f"/v1/users/{user}/memories/search", json={"query": "when does the Lisbon flight leave", "explain": True}
    ).json()
    assert explained["hits"] == plain
    assert [c["id"] for c in explained["candidates"] if c["kept"]] == [h["id"] for h in plain]
    lisbon = next(c for c in explained["candidates"] if "Lisbon" in c["text"])
    assert lisbon["kept"] and lisbon["dense_similarity"] > 0.25 and lisbon["keyword_score"] > 0 and lisbon["dense_rank"] == 0
    cat = next(c for c in explained["candidates"] if "Miso" in c["text"])  # among the dense candidates, below the floor
    assert not cat["kept"] and cat["reason"] == "similarity_floor" and cat["keyword_score"] is None
    shipped = Settings()
    floors = {
        "min_similarity": shipped.recall_min_score,
        "min_keyword_share": 0.3,
        "min_keyword_coverage": 0.3,
        "related_similarity": shipped.recall_related_similarity,
    }
    assert explained["floors"] == floors
    # No candidate passes on meaning at a floor of 0.99: what is kept is kept on words, the one
    # that matches no word is stopped by the similarity floor, and top_k 1 leaves the rest beyond it.
    strict = inspector.post(
        f"/v1/users/{user}/memories/search", json={"query": "Lisbon flight", "explain": True, "min_score": 0.99, "top_k": 1}
    ).json()
    verdicts = {c["text"].split()[1]: (c["kept"], c["reason"]) for c in strict["candidates"]}
    assert verdicts["flight"] == (True, "keywords") and verdicts["cat"] == (False, "similarity_floor")
    assert [h["text"] for h in strict["hits"]] == [lisbon["text"]]


def test_every_destructive_call_is_in_the_audit_log_with_who_and_what(inspector, service_url):
    user, sid = _id("au"), _id("as")
    memory = inspector.post(f"/v1/users/{user}/memories", json={"text": "a memory to delete"}).json()
    inspector.put(f"/v1/users/{user}/facts/color", json={"value": "blue"}).raise_for_status()
    inspector.post(f"/v1/sessions/{sid}/messages", json={"user_id": user, "messages": [{"role": "user", "content": "hello"}]})
    before = inspector.get("/v1/audit", params={"limit": 1}).json()["entries"]
    newest_before = before[0]["id"] if before else 0
    inspector.delete(f"/v1/users/{user}/memories/{memory['id']}").raise_for_status()
    inspector.delete(f"/v1/users/{user}/facts/color").raise_for_status()
    inspector.delete(f"/v1/sessions/{sid}").raise_for_status()
    inspector.delete(f"/v1/users/{user}").raise_for_status()
    assert inspector.delete(f"/v1/users/{user}/memories/{memory['id']}").status_code == 404  # nothing removed: no entry
    assert inspector.delete(f"/v1/users/{user}").json()["deleted"] is False  # forgotten already: no entry either
    entries = [e for e in inspector.get("/v1/audit", params={"limit": 10}).json()["entries"] if e["id"] > newest_before]
    assert [e["action"] for e in entries] == ["forget_user", "delete_session", "close_fact", "delete_memory"]
    assert {e["via"] for e in entries} == {"api"} and len({e["actor"] for e in entries}) == 1
    assert entries[0]["actor"].startswith("key:") and KEY_INSPECT not in str(entries)
    assert entries[3]["target"] == {"user_id": user, "memory_id": memory["id"]} and entries[3]["result"]["keywords"] == 1
    assert entries[1]["target"] == {"session_id": sid} and entries[1]["result"]["session"] == 1
    page = inspector.get("/v1/audit", params={"limit": 2, "before": entries[1]["id"]}).json()
    assert [e["id"] for e in page["entries"]] == [entries[2]["id"], entries[3]["id"]]
    with httpx.Client(base_url=service_url, timeout=60, headers={"X-API-Key": KEY_B}) as other:
        assert not [
            e for e in other.get("/v1/audit", params={"limit": 500}).json()["entries"] if e["target"].get("user_id") == user
        ]


def test_stats_and_export_answer_from_the_shared_stores(inspector):
    user, sid = _id("st"), _id("ss")
    turns = [{"role": "user", "content": f"turn {i} about the Oslo trip"} for i in range(3)]
    inspector.post(f"/v1/sessions/{sid}/messages", json={"user_id": user, "messages": turns}).raise_for_status()
    wait_memorized(inspector, sid, 3)
    inspector.post(f"/v1/users/{user}/memories/search", json={"query": "Oslo"}).raise_for_status()
    other = httpx.Client(base_url=inspector.base_url, timeout=60, headers={"X-API-Key": KEY_B})
    other_before = other.get("/v1/stats").json()["recall"]["samples"]
    before = inspector.get("/v1/stats").json()
    inspector.post(f"/v1/users/{user}/memories", json={"text": "one more"}).raise_for_status()
    for _ in range(3):
        inspector.post(f"/v1/users/{user}/memories/search", json={"query": "Oslo"}).raise_for_status()
    inspector.post(f"/v1/users/{user}/memories/search", json={"query": "Oslo", "explain": True}).raise_for_status()
    stats = inspector.get("/v1/stats").json()
    assert stats["memories"] == before["memories"] + 1
    # The tenant's own recalls, this replica's (one ingress replica here); explained searches are not timed.
    assert stats["recall"]["samples"] == min(1000, before["recall"]["samples"] + 3) and stats["recall"]["p50_ms"] > 0
    assert stats["llm"] == {"mode": "none", "summary_fallbacks": 0, "extraction_failures": 0}
    assert other.get("/v1/stats").json()["recall"]["samples"] == other_before  # another tenant's figures do not move
    other.close()
    exported = inspector.get(f"/v1/sessions/{sid}/export").json()
    assert exported["session"]["user_id"] == user and [m["seq"] for m in exported["messages"]] == [1, 2, 3]
    assert sorted(m["seq"] for m in exported["memories"]) == [1, 2, 3]
    assert inspector.get(f"/v1/sessions/{_id('none')}/export").status_code == 404


def test_the_inspector_cookie_reads_the_api_but_writes_only_with_its_csrf_token(inspector, service_url):
    user = _id("cs")
    memory = inspector.post(f"/v1/users/{user}/memories", json={"text": "keep me unless asked properly"}).json()
    cookie, token = _signed_in(service_url)
    with httpx.Client(base_url=service_url, timeout=60, cookies={COOKIE: cookie}) as browser:
        assert [m["id"] for m in browser.get(f"/v1/users/{user}/memories").json()] == [memory["id"]]
        forged = browser.delete(f"/v1/users/{user}/memories/{memory['id']}")
        assert forged.status_code == 403 and "CSRF" in forged.json()["detail"]
        assert browser.delete(f"/v1/users/{user}/memories/{memory['id']}", headers={CSRF_HEADER: "0" * 64}).status_code == 403
        form = browser.post("/ui/actions/delete_memory", data={"user_id": user, "memory_id": memory["id"]})
        assert form.status_code == 403
        assert [m["id"] for m in inspector.get(f"/v1/users/{user}/memories").json()] == [memory["id"]]
        done = browser.delete(f"/v1/users/{user}/memories/{memory['id']}", headers={CSRF_HEADER: token})
        assert done.status_code == 200
    entry = inspector.get("/v1/audit", params={"limit": 1}).json()["entries"][0]
    assert entry["via"] == "inspector" and entry["target"]["memory_id"] == memory["id"]
    with httpx.Client(base_url=service_url, timeout=60, cookies={COOKIE: cookie[:-3] + "xyz"}) as forger:
        assert forger.get(f"/v1/users/{user}/memories").status_code == 401  # a forged cookie is no cookie: keys are on
    with httpx.Client(base_url=service_url, timeout=60) as stranger:
        r = stranger.post("/ui/login", data={"api_key": "not-a-key"})
        assert r.status_code == 401 and COOKIE not in r.cookies


@contextmanager
def _browser(service_url: str, key: str) -> Iterator[httpx.Client]:
    """A client signed in to the inspector with `key`, as a browser after the sign-in form."""
    with httpx.Client(base_url=service_url, timeout=60) as browser:
        assert browser.post("/ui/login", data={"api_key": key, "next": "/ui"}).status_code == 303
        yield browser


def _archive(response: httpx.Response) -> list[dict]:
    """The lines of an exported archive (JSON Lines)."""
    return [json.loads(line) for line in response.text.splitlines()]


def _row(page: str, marker: str) -> str:
    """The table row of a page that carries `marker` (a data attribute)."""
    assert marker in page, marker
    return page.split(marker, 1)[1].split("</tr>", 1)[0]


@pytest.fixture
def team(service_url):
    """Tenant "team"'s admin key: it creates spaces and administers every one."""
    with httpx.Client(base_url=service_url, timeout=60, headers={"X-API-Key": KEY_TEAM_ADMIN}) as c:
        yield c


@pytest.fixture
def shared_space(team) -> dict:
    """A space with a memory an agent wrote, one promoted from a user (its text needs escaping) and a
    fact; the member key holds no grant on it yet."""
    space, user, sid = _id("sp"), _id("su"), _id("ss")
    team.post("/v1/spaces", json={"space_id": space}).raise_for_status()
    direct = team.post(
        f"/v1/spaces/{space}/memories", json={"text": "The deploy freeze starts on Friday at noon.", "agent_id": "planner"}
    ).json()
    own = team.post(f"/v1/users/{user}/memories", json={"text": "Ana keeps the on-call rota <b>in the wiki</b>."}).json()
    promoted = team.post(f"/v1/users/{user}/memories/{own['id']}/promote", json={"space": space}).json()
    team.put(f"/v1/spaces/{space}/facts/freeze_day", json={"value": "Friday"}).raise_for_status()
    turn = {"role": "user", "content": "When does the deploy freeze start?"}
    team.post(f"/v1/sessions/{sid}/messages", json={"user_id": user, "messages": [turn]}).raise_for_status()
    return {"space": space, "user": user, "sid": sid, "direct": direct, "own": own, "promoted": promoted}


def test_a_key_without_a_grant_sees_nothing_of_a_space(shared_space, service_url):
    space, user = shared_space["space"], shared_space["user"]
    with _browser(service_url, KEY_TEAM_MEMBER) as stranger:
        assert f'data-space="{space}"' not in stranger.get("/ui/spaces").text
        page = stranger.get(f"/ui/spaces/{space}")
        assert page.status_code == 404 and 'id="error-detail"' in page.text
        search = stranger.get(f"/ui/users/{user}/search", params={"query": "deploy freeze", "spaces": space})
        assert search.status_code == 404
        archive = stranger.get(f"/v1/spaces/{space}/export")  # the download link's target, with the cookie
        assert archive.status_code == 404
        for refused in (page, search, archive):
            assert "deploy freeze starts" not in refused.text and "on-call rota" not in refused.text
            assert "planner" not in refused.text and shared_space["promoted"]["id"] not in refused.text


def test_a_space_page_shows_its_memories_with_their_provenance_and_its_grants_to_its_admin(shared_space, team, service_url):
    space, user = shared_space["space"], shared_space["user"]
    admin_key = "key:" + hash_key(KEY_TEAM_ADMIN)[:12]
    member_key = "key:" + hash_key(KEY_TEAM_MEMBER)[:12]
    team.put(f"/v1/spaces/{space}/grants/{member_key}", json={"role": "read"}).raise_for_status()
    with _browser(service_url, KEY_TEAM_ADMIN) as admin:
        assert 'href="/ui/spaces"' in admin.get("/ui").text
        listed = _row(admin.get("/ui/spaces").text, f'data-space="{space}"')
        assert "<td data-role>admin</td>" in listed and "<td data-memories>2</td>" in listed
        page = admin.get(f"/ui/spaces/{space}").text
        direct = _row(page, f'data-memory-id="{shared_space["direct"]["id"]}"')
        assert "The deploy freeze starts on Friday at noon." in direct and "agent planner" in direct
        assert f"added by {admin_key}" in direct and "promoted from" not in direct
        promoted = _row(page, f'data-memory-id="{shared_space["promoted"]["id"]}"')
        assert "&lt;b&gt;in the wiki&lt;/b&gt;" in promoted and "<b>in the wiki" not in page
        assert f'promoted from <a href="/ui/users/{user}">{user}</a>' in promoted
        assert f"memory {shared_space['own']['id']}" in promoted
        assert "Friday" in _row(page, 'data-key="freeze_day"')
        assert "<td>read</td>" in _row(page, f'data-principal="{member_key}"')
    with _browser(service_url, KEY_TEAM_MEMBER) as reader:
        assert "<td data-role>read</td>" in _row(reader.get("/ui/spaces").text, f'data-space="{space}"')
        page = reader.get(f"/ui/spaces/{space}")
        assert page.status_code == 200 and "deploy freeze starts" in page.text and "agent planner" in page.text
        assert 'id="grants"' not in page.text  # the grants are its admin's to see
        link = f'id="space-export" href="/v1/spaces/{space}/export" download'
        assert link in page.text
        download = reader.get(f"/v1/spaces/{space}/export")  # what the link gives a browser signed in as the reader
        assert download.status_code == 200 and "attachment" in download.headers["content-disposition"]
        lines = _archive(download)
        assert lines[0]["type"] == "archive" and lines[-1]["type"] == "end"
        texts = {line["text"] for line in lines if line["type"] == "memory"}
        assert texts == {"The deploy freeze starts on Friday at noon.", "Ana keeps the on-call rota <b>in the wiki</b>."}
        assert [line["value"] for line in lines if line["type"] == "fact"] == ["Friday"]


def test_a_user_page_downloads_the_users_archive_through_the_api(inspector, service_url):
    user, sid = _id("ex"), _id("es")
    inspector.post(f"/v1/users/{user}/memories", json={"text": "Ravi's passport number ends in 4471."}).raise_for_status()
    turn = {"role": "user", "content": "Book the 7:40 train to Lyon."}
    inspector.post(f"/v1/sessions/{sid}/messages", json={"user_id": user, "messages": [turn]}).raise_for_status()
    with _browser(service_url, KEY_INSPECT) as browser:
        page = browser.get(f"/ui/users/{user}").text
        assert f'id="user-export" href="/v1/users/{user}/export" download' in page
        download = browser.get(f"/v1/users/{user}/export")  # what the link gives the signed-in browser
        assert download.status_code == 200 and f'filename="{user}.memserve.jsonl"' in download.headers["content-disposition"]
    lines = _archive(download)
    assert lines[0]["type"] == "archive" and lines[0]["user_id"] == user and lines[-1]["type"] == "end"
    assert [line["session_id"] for line in lines if line["type"] == "session"] == [sid]
    assert [line["message"]["content"] for line in lines if line["type"] == "message"] == [turn["content"]]
    assert "Ravi's passport number ends in 4471." in {line["text"] for line in lines if line["type"] == "memory"}
    with _browser(service_url, KEY_B) as other_tenant:  # another tenant's sign-in downloads an empty archive
        theirs = _archive(other_tenant.get(f"/v1/users/{user}/export"))
        assert [line["type"] for line in theirs] == ["archive", "end"]


def test_search_and_the_next_prompt_read_the_spaces_named_and_label_what_they_recall(shared_space, service_url):
    space, user, sid = shared_space["space"], shared_space["user"], shared_space["sid"]
    direct = shared_space["direct"]["id"]
    with _browser(service_url, KEY_TEAM_ADMIN) as admin:
        alone = admin.get(f"/ui/users/{user}/search", params={"query": "when does the deploy freeze start"}).text
        assert f'data-memory-id="{direct}"' not in alone
        named = {"query": "when does the deploy freeze start", "spaces": f" {space} , {space},"}
        found = admin.get(f"/ui/users/{user}/search", params=named).text
        assert f"space {space}</a>" in _row(found, f'data-memory-id="{direct}"')
        assert f'name="spaces" type="text" value=" {space} , {space},"' in found
        prompt = admin.get(f"/ui/sessions/{sid}/prompt", params=named)
        assert prompt.status_code == 200 and f"space {space}</a>" in _row(prompt.text, f'data-memory-id="{direct}"')
        assert admin.get(f"/ui/users/{user}/search", params={"query": "x", "spaces": "no/such"}).status_code == 422
