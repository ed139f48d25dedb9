"""The inspector in a real headless browser: Selenium driving Debian's chromium through its
version-matched chromium-driver (scripts/browser.sh installs both), against the deployed app.

Each view is also saved as a screenshot: under docs/inspector/, which the docs site shows (docs/inspector/index.md), when
MEMSERVE_SCREENSHOTS names that folder; in a temporary folder otherwise, so a test run leaves the
checkout as it was."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from serve_app.core.inspector_auth import COOKIE

from .conftest import KEY_INSPECT, KEY_TEAM_ADMIN, wait_memorized

SHOTS = Path(os.environ.get("MEMSERVE_SCREENSHOTS") or tempfile.mkdtemp(prefix="inspector-shots-"))
DESKTOP, PHONE = (1280, 860), (390, 844)


def _driver(*, javascript: bool = True) -> WebDriver:
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={DESKTOP[0]},{DESKTOP[1]}",
    ):
        options.add_argument(arg)
    if not javascript:
        options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def _shot(driver: WebDriver, name: str, focus: str | None = None) -> None:
    """A small PNG of the page, 64 colours: its full height (up to 1800 px), or the window around
    the element `focus` selects."""
    from PIL import Image

    SHOTS.mkdir(parents=True, exist_ok=True)
    width = driver.get_window_size()["width"]
    if focus is None:
        height = min(1800, driver.execute_script("return document.documentElement.scrollHeight"))
        driver.set_window_size(width, height)
    else:
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", driver.find_element(By.CSS_SELECTOR, focus))
    path = SHOTS / f"{name}.png"
    driver.save_screenshot(str(path))
    with Image.open(path) as image:
        image.convert("RGB").quantize(colors=64).save(path, optimize=True)
    driver.set_window_size(*DESKTOP)


@pytest.fixture(scope="module")
def world(service_url) -> dict:
    """One user with a compacted session, a fact with a history and memories, in tenant "inspector"."""
    user, sid = f"ines-{uuid.uuid4().hex[:6]}", f"trip-{uuid.uuid4().hex[:6]}"
    with httpx.Client(base_url=service_url, timeout=60, headers={"X-API-Key": KEY_INSPECT}) as api:
        turns = []
        for i in range(14):
            turns.append(
                {
                    "role": "user",
                    "content": f"Day {i + 1} of the Kyoto trip: we visited temple number {i + 1} "
                    f"and paid {1000 + i * 50} yen for booking KY-{4400 + i}. " + "It rained a little. " * 12,
                }
            )
            turns.append({"role": "assistant", "content": f"Noted booking KY-{4400 + i} for day {i + 1}."})
        api.post(f"/v1/sessions/{sid}/messages", json={"user_id": user, "messages": turns}).raise_for_status()
        api.post(f"/v1/sessions/{sid}/compress").raise_for_status()
        api.put(f"/v1/users/{user}/facts/home_city", json={"value": "Paris", "category": "fact"}).raise_for_status()
        api.put(
            f"/v1/users/{user}/facts/home_city",
            json={"value": "Lyon", "category": "fact", "source_session": sid, "source_seqs": [3, 4]},
        ).raise_for_status()
        memory = api.post(f"/v1/users/{user}/memories", json={"text": "Ines is allergic to peanuts."}).json()
        info = wait_memorized(api, sid, len(turns))
        assert info["covers_upto_seq"] > 0
        return {"user": user, "sid": sid, "memory": memory, "info": info, "url": service_url}


@pytest.fixture(scope="module")
def browser(world) -> Iterator[WebDriver]:
    driver = _driver()
    yield driver
    driver.quit()


def _sign_in(driver: WebDriver, url: str, key: str) -> None:
    driver.get(f"{url}/ui")
    assert "/ui/login" in driver.current_url  # keys are on: the page asks for one
    field = driver.find_element(By.ID, "api_key")
    field.clear()
    field.send_keys(key)
    field.send_keys(Keys.ENTER)


def _wait_url(driver: WebDriver, part: str) -> None:
    """A click that submits a form returns before the next page has loaded."""
    WebDriverWait(driver, 15).until(expected_conditions.url_contains(part))


def test_a_wrong_key_is_refused(world, browser):
    _sign_in(browser, world["url"], "not-the-key")
    assert "not valid" in browser.find_element(By.ID, "login-error").text
    assert "/ui/login" in browser.current_url and browser.get_cookie(COOKIE) is None
    _shot(browser, "sign-in")


def test_sign_in_exchanges_the_key_for_an_httponly_cookie(world, browser):
    _sign_in(browser, world["url"], KEY_INSPECT)
    WebDriverWait(browser, 15).until(lambda d: d.current_url.endswith("/ui"))
    cookie = browser.get_cookie(COOKIE)
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and KEY_INSPECT not in cookie["value"]
    assert browser.execute_script("return window.localStorage.length + window.sessionStorage.length") == 0
    assert COOKIE not in browser.execute_script("return document.cookie")
    users = browser.find_element(By.ID, "users").text
    assert world["user"] in users
    _shot(browser, "users")


def test_session_log_shows_the_checkpoint_boundary_and_cursors(world, browser):
    info = world["info"]
    browser.get(f"{world['url']}/ui/sessions/{world['sid']}")
    boundary = browser.find_element(By.ID, "checkpoint-boundary")
    assert f"seq ≤ {info['covers_upto_seq']}" in boundary.text
    rows = browser.find_elements(By.CSS_SELECTOR, "#log tr[data-seq]")
    seqs = [int(r.get_attribute("data-seq")) for r in rows]
    above = boundary.find_elements(By.XPATH, "preceding-sibling::tr[@data-seq]")
    assert [int(r.get_attribute("data-seq")) for r in above] == [s for s in seqs if s <= info["covers_upto_seq"]]
    cursors = {e.get_attribute("data-cursor"): int(e.text) for e in browser.find_elements(By.CSS_SELECTOR, "[data-cursor]")}
    assert cursors == {k: info[k] for k in ("covers_upto_seq", "memorized_upto_seq", "extracted_upto_seq")}
    _shot(browser, "session")
    _shot(browser, "session-boundary", focus="#checkpoint-boundary")


def test_the_next_prompt_view_counts_exactly_what_the_context_endpoint_builds(world, browser):
    query, max_tokens = "how much did the booking KY-4403 cost", 1024
    browser.get(f"{world['url']}/ui/sessions/{world['sid']}/prompt?query={query.replace(' ', '+')}&max_tokens={max_tokens}")
    shown = {
        row.get_attribute("data-section"): int(row.find_element(By.CSS_SELECTOR, "[data-tokens]").text)
        for row in browser.find_elements(By.CSS_SELECTOR, "#sections tr[data-section]")
    }
    with httpx.Client(base_url=world["url"], timeout=60, headers={"X-API-Key": KEY_INSPECT}) as api:
        body = {"user_id": world["user"], "session_id": world["sid"], "query": query, "max_tokens": max_tokens}
        usage = api.post("/v1/context", json=body).json()["usage"]
    assert shown == {name: section["tokens"] for name, section in usage["sections"].items()}
    assert shown["history"] > 0 and shown["summary"] > 0
    omitted = browser.find_element(By.ID, "omitted").text
    assert (f"{usage['omitted_turns']} unsummarized" in omitted) if usage["omitted_turns"] else ("No unsummarized" in omitted)
    assert browser.find_elements(By.CSS_SELECTOR, "#candidates tr[data-memory-id]")
    _shot(browser, "next-prompt")


def test_search_with_explain_shows_the_scores_the_api_gives(world, browser):
    query = "temple visit on day 3"
    browser.get(f"{world['url']}/ui/users/{world['user']}")
    field = browser.find_element(By.ID, "query")
    field.send_keys(query)
    field.send_keys(Keys.ENTER)
    _wait_url(browser, "/search")
    rows = browser.find_elements(By.CSS_SELECTOR, "#candidates tr[data-memory-id]")
    with httpx.Client(base_url=world["url"], timeout=60, headers={"X-API-Key": KEY_INSPECT}) as api:
        explained = api.post(f"/v1/users/{world['user']}/memories/search", json={"query": query, "explain": True}).json()
    assert [r.get_attribute("data-memory-id") for r in rows] == [c["id"] for c in explained["candidates"]]
    for row, candidate in zip(rows, explained["candidates"], strict=True):
        assert row.find_element(By.CSS_SELECTOR, "[data-score=relevance]").text == f"{candidate['score']:.4f}"
        assert row.find_element(By.CSS_SELECTOR, "[data-score=fused]").text == f"{candidate['fused_score']:.4f}"
        assert candidate["reason"] in row.text and ("kept" if candidate["kept"] else "dropped") in row.text
    _shot(browser, "search-explain")


def test_a_facts_history_is_a_timeline_with_its_source(world, browser):
    browser.get(f"{world['url']}/ui/users/{world['user']}/facts/home_city")
    items = browser.find_elements(By.CSS_SELECTOR, "#history li")
    assert len(items) == 2
    assert "Lyon" in items[0].text and "current" in items[0].text and world["sid"] in items[0].text
    assert "Paris" in items[1].text and "superseded" in items[1].text
    _shot(browser, "fact-history")


def test_a_delete_asks_for_confirmation_and_lands_in_the_audit_log(world, browser):
    memory = world["memory"]
    browser.get(f"{world['url']}/ui/users/{world['user']}")
    link = next(
        a for a in browser.find_elements(By.CSS_SELECTOR, "#memories a.danger") if memory["id"] in a.get_attribute("href")
    )
    link.click()
    assert "Delete a memory?" in browser.find_element(By.TAG_NAME, "h1").text
    _shot(browser, "confirm-delete")
    with httpx.Client(base_url=world["url"], timeout=60, headers={"X-API-Key": KEY_INSPECT}) as api:
        assert memory["id"] in [m["id"] for m in api.get(f"/v1/users/{world['user']}/memories").json()]  # not before confirming
        browser.find_element(By.ID, "confirm").click()
        _wait_url(browser, "/ui/audit")
        assert "/ui/audit" in browser.current_url and "delete memory" in browser.find_element(By.ID, "done").text
        assert memory["id"] not in [m["id"] for m in api.get(f"/v1/users/{world['user']}/memories").json()]
    newest = browser.find_element(By.CSS_SELECTOR, "#audit tbody tr")
    assert newest.get_attribute("data-action") == "delete_memory" and memory["id"] in newest.text and "inspector" in newest.text
    _shot(browser, "audit")


def test_a_forged_action_without_the_csrf_token_is_refused(world, browser):
    if browser.get_cookie(COOKIE) is None:  # run alone
        _sign_in(browser, world["url"], KEY_INSPECT)
        WebDriverWait(browser, 15).until(lambda d: d.get_cookie(COOKIE) is not None)
    cookie = browser.get_cookie(COOKIE)["value"]
    with httpx.Client(base_url=world["url"], timeout=60, cookies={COOKIE: cookie}) as forger:
        r = forger.post("/ui/actions/forget_user", data={"user_id": world["user"]})
        assert r.status_code == 403 and "CSRF" in r.text
        assert forger.delete(f"/v1/users/{world['user']}").status_code == 403
        assert forger.get(f"/v1/users/{world['user']}/facts").json()  # still there


def test_pages_read_with_javascript_blocked_fit_a_phone_and_work_by_keyboard(world, browser):
    browser.set_window_size(*PHONE)
    browser.get(f"{world['url']}/ui/sessions/{world['sid']}")
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth + 1")
    _shot(browser, "session-phone")
    browser.set_window_size(*DESKTOP)
    browser.get(f"{world['url']}/ui/users/{world['user']}")
    browser.find_element(By.TAG_NAME, "body").send_keys(Keys.TAB)
    assert browser.switch_to.active_element.text == "Skip to content"
    for field in browser.find_elements(By.CSS_SELECTOR, "input:not([type=hidden])"):
        assert browser.find_elements(By.CSS_SELECTOR, f"label[for='{field.get_attribute('id')}']"), field.get_attribute("name")
    blocked = _driver(javascript=False)
    try:
        blocked.get(f"{world['url']}/ui/login")
        blocked.find_element(By.ID, "api_key").send_keys(KEY_INSPECT, Keys.ENTER)
        WebDriverWait(blocked, 15).until(lambda d: d.current_url.endswith("/ui"))
        blocked.get(f"{world['url']}/ui/sessions/{world['sid']}")
        assert blocked.find_element(By.ID, "checkpoint-boundary").is_displayed()
    finally:
        blocked.quit()


def test_a_space_and_its_provenance_read_with_javascript_blocked(service_url):
    """Tenant "team"'s admin: a space with a memory an agent wrote and one promoted from a user."""
    space, user = f"crew-{uuid.uuid4().hex[:6]}", f"rosa-{uuid.uuid4().hex[:6]}"
    with httpx.Client(base_url=service_url, timeout=60, headers={"X-API-Key": KEY_TEAM_ADMIN}) as api:
        api.post("/v1/spaces", json={"space_id": space}).raise_for_status()
        note = {"text": "Standup moved to 09:30.", "agent_id": "scheduler"}
        api.post(f"/v1/spaces/{space}/memories", json=note).raise_for_status()
        own = api.post(f"/v1/users/{user}/memories", json={"text": "Rosa owns the release checklist."}).json()
        api.post(f"/v1/users/{user}/memories/{own['id']}/promote", json={"space": space}).raise_for_status()
    blocked = _driver(javascript=False)
    try:
        blocked.get(f"{service_url}/ui/login")
        blocked.find_element(By.ID, "api_key").send_keys(KEY_TEAM_ADMIN, Keys.ENTER)
        WebDriverWait(blocked, 15).until(lambda d: d.current_url.endswith("/ui"))
        blocked.find_element(By.LINK_TEXT, "Spaces").click()
        _wait_url(blocked, "/ui/spaces")
        row = blocked.find_element(By.CSS_SELECTOR, f"#spaces tr[data-space='{space}']")
        assert row.find_element(By.CSS_SELECTOR, "[data-role]").text == "admin"
        row.find_element(By.LINK_TEXT, space).click()
        _wait_url(blocked, f"/ui/spaces/{space}")
        memories = blocked.find_element(By.ID, "memories").text
        assert "agent scheduler" in memories and f"promoted from {user}" in memories
        _shot(blocked, "space")
    finally:
        blocked.quit()
