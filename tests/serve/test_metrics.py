"""Every metric the Grafana dashboard queries is exported by the running service."""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path

import httpx

from tests.serve.conftest import wait_memorized

DASHBOARD = Path(__file__).resolve().parents[2] / "kuberay" / "grafana-dashboard.json"
# PromQL functions, keywords and label names that look like metric names inside an expression.
_NOT_METRICS = {"sum", "rate", "by", "le", "histogram_quantile", "route", "section", "deployment", "error_code", "application"}


def dashboard_metrics() -> set[str]:
    names = set()
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel["targets"]:
            expr = re.sub(r"\{[^}]*\}", "", target["expr"])  # label matchers
            expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
            names |= {w for w in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr) if w not in _NOT_METRICS}
    return names


def exported(metrics_url: str) -> set[str]:
    text = httpx.get(metrics_url, timeout=10).text
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_dashboard_parses_to_known_metric_families():
    names = dashboard_metrics()
    assert "ray_memserve_recall_latency_ms_bucket" in names and "ray_serve_num_http_requests_total" in names
    assert all(n.startswith("ray_") for n in names), names


def test_every_dashboard_metric_is_exported(client: httpx.Client, metrics_url: str):
    session, user = "m-" + uuid.uuid4().hex[:8], "metrics-user"
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"invoice INV-{i} of ${i}.00 is due " * 8} for i in range(30)
    ]
    client.post(f"/v1/sessions/{session}/messages", json={"user_id": user, "messages": turns}).raise_for_status()
    wait_memorized(client, session, 30)
    client.post(f"/v1/sessions/{session}/compress").raise_for_status()
    client.post(
        "/v1/context", json={"user_id": user, "session_id": session, "query": "invoice INV-3", "max_tokens": 2048}
    ).raise_for_status()
    client.post(f"/v1/users/{user}/memories/search", json={"query": "invoice due"}).raise_for_status()
    client.get("/v1/sessions/no-such-session")  # an error response for the error panel
    wanted = dashboard_metrics()
    deadline = time.monotonic() + 90  # Ray exports metrics every few seconds
    missing = wanted
    while time.monotonic() < deadline:
        missing = wanted - exported(metrics_url)
        if not missing:
            return
        time.sleep(2)
    raise AssertionError(f"metrics queried by the dashboard but not exported: {sorted(missing)}")
