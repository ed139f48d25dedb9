"""Hostile ids and the endpoint matrix that tenant-isolation probes walk (tests and bench/reliability.py)."""

from __future__ import annotations

# Quotes, backslashes, newlines, unicode, path tricks, an injection attempt, too long, empty, blank.
HOSTILE_IDS = ['x" or user_id != "', "a\\b", "q'\n", "ünï", "../etc", "x" * 200, "", " "]


def tenant_endpoints() -> list[tuple[str, str, dict | None]]:
    """The routes that name no session or user: each answers about the caller's own tenant."""
    return [("GET", "/v1/users", None), ("GET", "/v1/audit", None), ("GET", "/v1/stats", None)]


def endpoints(sid: str, user: str) -> list[tuple[str, str, dict | None]]:
    """Every API v1 route on one session and user: (method, path, JSON body)."""
    return [
        ("GET", f"/v1/sessions/{sid}", None),
        ("GET", f"/v1/sessions/{sid}/messages", None),
        ("GET", f"/v1/sessions/{sid}/export", None),
        ("POST", f"/v1/sessions/{sid}/compress", None),
        ("POST", "/v1/context", {"user_id": user, "session_id": sid, "query": "secret"}),
        ("GET", f"/v1/users/{user}/sessions", None),
        ("GET", f"/v1/users/{user}/facts", None),
        ("GET", f"/v1/users/{user}/facts/plan", None),
        ("PUT", f"/v1/users/{user}/facts/plan", {"value": "overwritten", "category": "fact"}),
        ("GET", f"/v1/users/{user}/facts/plan/history", None),
        ("GET", f"/v1/users/{user}/memories", None),
        ("POST", f"/v1/users/{user}/memories", {"text": "injected"}),
        ("POST", f"/v1/users/{user}/memories/search", {"query": "secret plan", "top_k": 10}),
        ("POST", f"/v1/users/{user}/memories/search", {"query": "secret plan", "explain": True}),
        ("GET", f"/v1/users/{user}/export", None),
        ("POST", f"/v1/users/{user}/import", None),
        ("DELETE", f"/v1/users/{user}/facts/plan", None),
        ("DELETE", f"/v1/users/{user}/memories/m1", None),
        ("DELETE", f"/v1/sessions/{sid}", None),
        # Last: a write to the same ids creates the caller's own session, in its own tenant.
        ("POST", f"/v1/sessions/{sid}/messages", {"user_id": user, "messages": [{"role": "user", "content": "x"}]}),
        ("DELETE", f"/v1/users/{user}", None),
    ]


def space_endpoints(space: str, user: str) -> list[tuple[str, str, dict | None]]:
    """Every route that reads, writes or names one memory space: (method, path, JSON body). A key
    without a grant on the space is answered 404 by each (403 where it asks to create one)."""
    return [
        ("GET", f"/v1/spaces/{space}", None),
        ("GET", f"/v1/spaces/{space}/memories", None),
        ("POST", f"/v1/spaces/{space}/memories/search", {"query": "secret plan"}),
        ("GET", f"/v1/spaces/{space}/facts", None),
        ("GET", f"/v1/spaces/{space}/facts/plan/history", None),
        ("GET", f"/v1/spaces/{space}/grants", None),
        ("GET", f"/v1/spaces/{space}/export", None),
        ("POST", f"/v1/users/{user}/memories/search", {"query": "secret plan", "spaces": [space]}),
        ("POST", f"/v1/users/{user}/memories/search", {"query": "secret plan", "spaces": [space], "explain": True}),
        ("POST", "/v1/context", {"user_id": user, "session_id": "probe", "query": "secret plan", "spaces": [space]}),
        ("POST", f"/v1/spaces/{space}/memories", {"text": "injected"}),
        ("PUT", f"/v1/spaces/{space}/facts/plan", {"value": "overwritten", "category": "fact"}),
        ("PUT", f"/v1/spaces/{space}/grants/local", {"role": "admin"}),
        ("POST", f"/v1/users/{user}/memories/m1/promote", {"space": space}),
        ("POST", f"/v1/users/{user}/facts/plan/promote", {"space": space}),
        ("DELETE", f"/v1/spaces/{space}/facts/plan", None),
        ("DELETE", f"/v1/spaces/{space}/memories/m1", None),
        ("DELETE", f"/v1/spaces/{space}/grants/local", None),
        ("DELETE", f"/v1/spaces/{space}", None),
        ("POST", "/v1/spaces", {"space_id": space}),
    ]
