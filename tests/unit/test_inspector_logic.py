"""The inspector's pure parts: the signed session and its CSRF token, the budget bar, the log's
checkpoint boundary, and the recent-timings percentiles of /v1/stats."""

from __future__ import annotations

import time

from starlette.requests import Request

from serve_app.api.inspector.router import _cross_site, _invalid_fields, _safe_next
from serve_app.api.inspector.views import budget_bar, log_rows, named_spaces, omitted_seqs
from serve_app.core.inspector_auth import SessionSigner
from serve_app.core.timings import RecentTimings


def test_a_session_cookie_reads_back_only_with_its_secret_and_within_its_age():
    signer = SessionSigner("secret-a", max_age_s=60)
    cookie = signer.issue("tenant-1", "ab" * 32)
    session = signer.read(cookie)
    assert session is not None and (session.tenant, session.key_digest) == ("tenant-1", "ab" * 32)
    assert SessionSigner("secret-b", max_age_s=60).read(cookie) is None  # another deployment's secret
    assert signer.read(cookie[:-2] + ("A" if cookie[-2] != "A" else "B") + cookie[-1]) is None  # tampered
    assert signer.read("") is None and signer.read("not-a-cookie") is None
    expired = SessionSigner("secret-a", max_age_s=1)
    old = expired.issue("tenant-1", "local")
    time.sleep(2.1)
    assert expired.read(old) is None


def test_the_csrf_token_belongs_to_one_session():
    signer = SessionSigner("secret", max_age_s=60)
    one, two = (signer.read(signer.issue("t", "local")) for _ in range(2))
    assert one is not None and two is not None
    assert signer.csrf_ok(one, signer.csrf_token(one))
    assert not signer.csrf_ok(one, signer.csrf_token(two))
    assert not signer.csrf_ok(one, "") and not signer.csrf_ok(one, None)


def test_budget_bar_orders_sections_and_leaves_the_rest_free():
    usage = {
        "max_tokens": 1000,
        "sections": {
            "history": {"tokens": 300},
            "system": {"tokens": 100},
            "memory": {"tokens": 0},
            "output_reserved": {"tokens": 100},
        },
    }
    bar = budget_bar(usage)
    assert [p.section for p in bar] == ["system", "history", "output_reserved", "free"]
    assert [p.tokens for p in bar] == [100, 300, 100, 500]
    assert sum(p.percent for p in bar) == 100


def test_log_rows_put_the_checkpoint_boundary_after_the_last_summarized_turn():
    info = {"covers_upto_seq": 2, "memorized_upto_seq": 3, "extracted_upto_seq": 1}
    rows = log_rows([{"seq": s} for s in (1, 2, 3, 4)], info)
    assert [r.message["seq"] if r.message else "|" for r in rows] == [1, 2, "|", 3, 4]
    assert [r.memorized for r in rows if r.message] == [True, True, True, False]
    assert [r.extracted for r in rows if r.message] == [True, False, False, False]
    next_page = log_rows([{"seq": 3}, {"seq": 4}], info)
    assert next_page[0].message is None  # a page that starts right after the boundary shows it first
    assert all(r.message for r in log_rows([{"seq": 4}], info))
    assert omitted_seqs([{"seq": 3}, {"seq": 4}, {"seq": 5}], [4, 5]) == [3]


def test_recent_timings_keep_the_newest_and_give_nearest_rank_percentiles():
    timings = RecentTimings(keep=4)
    assert timings.percentile(50) is None
    for ms in (100.0, 1.0, 2.0, 3.0, 4.0):  # 100 falls out
        timings.add(ms)
    assert len(timings) == 4
    assert timings.percentile(50) == 2.0 and timings.percentile(95) == 4.0 and timings.percentile(100) == 4.0


def _request(headers: dict[str, str], scheme: str = "http") -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in {"host": "mem.example:8000", **headers}.items()]
    return Request({"type": "http", "method": "POST", "scheme": scheme, "path": "/ui/login", "headers": raw, "query_string": b""})


def test_a_form_posted_from_another_site_is_told_apart_from_the_inspectors_own():
    assert not _cross_site(_request({"sec-fetch-site": "same-origin"}))
    assert not _cross_site(_request({}))  # not a browser: no cookie of the visitor rides along
    assert not _cross_site(_request({"origin": "http://mem.example:8000"}))
    assert not _cross_site(_request({"origin": "https://mem.example:8000", "x-forwarded-proto": "https"}))
    for headers in (
        {"sec-fetch-site": "cross-site"},
        {"sec-fetch-site": "same-site"},
        {"origin": "https://evil.example"},
        {"origin": "null"},
    ):
        assert _cross_site(_request(headers)), headers


def test_sign_in_returns_only_to_the_inspector_and_actions_take_only_ids():
    assert _safe_next("/ui/sessions/s1?after=50") == "/ui/sessions/s1?after=50"
    for target in ("https://evil.example/ui", "//evil.example/ui", "/ui\\@evil", "/v1/users", "/ui//evil.example"):
        assert _safe_next(target) == "/ui", target
    assert _invalid_fields({"user_id": "alice", "memory_id": "m-1"}) is None
    for bad in ("", "alice/facts/k", "../x", "a" * 129, "a b"):
        assert _invalid_fields({"user_id": bad}), bad


def test_the_spaces_field_names_each_space_once_in_order():
    assert named_spaces("") == [] and named_spaces(" , ,") == []
    assert named_spaces(" team-a, ops ,team-a,") == ["team-a", "ops"]
