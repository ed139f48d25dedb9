"""Two Ray nodes: the app deployed with `serve deploy` (a proxy on every node), traffic through both
nodes' proxies, then the worker node dies under load (its raylet killed by PID) and the head
carries on: requests succeed with the README's retries, replicas start again on the head, and
every acknowledged append reads back and is memorized."""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import yaml
from tenacity import retry, retry_if_exception_type, stop_after_delay, wait_exponential

from serve_app.cli import DEFAULT_CONFIG
from serve_app.embedded.ports import LOOPBACK, free_listen_port
from tests.cluster.ray_nodes import TwoNodes, start_two_nodes

pytestmark = pytest.mark.serve
USER = "two-nodes-" + uuid.uuid4().hex[:6]


class Retryable(Exception):
    """A 5xx or a refused connection: what the README tells a client to retry."""


RETRIED: list[str] = []  # every retried attempt, for the summary


@retry(retry=retry_if_exception_type(Retryable), wait=wait_exponential(0.1, max=1), stop=stop_after_delay(60), reraise=True)
def call(client: httpx.Client, method: str, path: str, body: dict | None = None) -> dict:
    try:
        response = client.request(method, path, json=body)
    except httpx.TransportError as exc:
        RETRIED.append(type(exc).__name__)
        raise Retryable(repr(exc)) from exc
    if response.status_code >= 500:
        RETRIED.append(str(response.status_code))
        raise Retryable(f"{response.status_code} {response.text[:200]}")
    response.raise_for_status()
    return response.json()


def two_node_config(path: Path, port: int) -> Path:
    """configs/local.yaml as a cluster would run it: a proxy on every node, two Ingress replicas."""
    raw = yaml.safe_load(Path(DEFAULT_CONFIG).read_text())
    raw["proxy_location"] = "EveryNode"
    raw["http_options"] = {"host": LOOPBACK, "port": port}
    app = raw["applications"][0]
    app["args"] = {"milvus_collection": "two_nodes", "memorizer_sweep_interval_s": 0.2}
    for deployment in app["deployments"]:
        if deployment["name"] == "Ingress":
            deployment["num_replicas"] = 2
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def running_replicas(nodes: TwoNodes) -> dict[str, list[str]]:
    """Deployment -> the node ids of its RUNNING replicas (Serve's own view, over the dashboard)."""
    app = (nodes.serve_details().get("applications") or {}).get("memserve") or {}
    return {
        name: [r["node_id"] for r in d.get("replicas", []) if r.get("state") == "RUNNING"]
        for name, d in (app.get("deployments") or {}).items()
    }


def wait_for(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def test_two_nodes_serve_through_both_proxies_and_the_head_carries_on_when_the_worker_dies(tmp_path, backends):
    head_port, worker_port = free_listen_port(LOOPBACK), free_listen_port(LOOPBACK)
    env = {**os.environ, **backends.app_env, "HF_HUB_OFFLINE": "1"}
    nodes = start_two_nodes(tmp_path, env, head_port, worker_port)
    try:
        nodes.serve_deploy(two_node_config(tmp_path / "two-nodes.yaml", head_port))
        ids = nodes.nodes()
        head_id = next(i for i, is_head in ids.items() if is_head)
        spread = wait_for(
            lambda: (r := running_replicas(nodes)) and len(r.get("Ingress", [])) == 2 and r,
            240,
            "two RUNNING Ingress replicas",
        )
        assert set(spread["Ingress"]) == set(ids), f"Serve's soft spread put both replicas on one node: {spread}"

        acknowledged: dict[str, int] = {}
        with (
            httpx.Client(base_url=f"http://{LOOPBACK}:{head_port}", timeout=30) as head,
            httpx.Client(base_url=f"http://{LOOPBACK}:{worker_port}", timeout=30) as worker,
        ):
            for name, client in (("head", head), ("worker", worker)):  # each node's own proxy answers
                session = f"{USER}-via-{name}"
                out = call(client, "POST", f"/v1/sessions/{session}/messages", {"user_id": USER, "messages": [
                    {"role": "user", "content": f"hello through the {name} proxy", "id": f"{name}-1"}]})  # fmt: skip
                acknowledged[session] = out["seqs"][-1]
                context = {"user_id": USER, "session_id": session, "query": "proxy", "max_tokens": 512}
                assert call(client, "POST", "/v1/context", context)["messages"]

            failures: list[str] = []
            after_kill: list[float] = []  # acknowledged appends once the worker node was killed
            killed_at = [float("inf")]
            stop = threading.Event()

            def writer(w: int) -> None:
                n = 0
                with httpx.Client(base_url=f"http://{LOOPBACK}:{head_port}", timeout=30) as client:
                    while not stop.is_set():
                        session = f"{USER}-load-{w}"
                        body = {"user_id": USER, "messages": [{"role": "user", "content": f"note {w}.{n}", "id": f"{w}.{n}"}]}
                        try:
                            out = call(client, "POST", f"/v1/sessions/{session}/messages", body)
                            acknowledged[session] = max(acknowledged.get(session, 0), out["seqs"][-1])
                            if time.monotonic() > killed_at[0]:
                                after_kill.append(time.monotonic() - killed_at[0])
                            call(client, "POST", "/v1/context", {"user_id": USER, "session_id": session, "query": "note"})
                        except Exception as exc:  # a request that failed even after its retries
                            failures.append(repr(exc))
                        n += 1

            threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
            for t in threads:
                t.start()
            time.sleep(8)
            nodes.worker.raylet().kill()  # SIGKILL: the worker node dies, the head stays
            killed_at[0] = time.monotonic()
            wait_for(lambda: len(nodes.nodes()) == 1, 90, "the worker node marked dead")
            dead_after_s = time.monotonic() - killed_at[0]
            time.sleep(15)
            stop.set()
            for t in threads:
                t.join(120)

            assert failures == []
            after = wait_for(
                lambda: (r := running_replicas(nodes)) and len(r.get("Ingress", [])) == 2 and r,
                180,
                "two RUNNING Ingress replicas again",
            )
            assert all(node == head_id for replicas in after.values() for node in replicas), after
            for session, upto in acknowledged.items():
                got = call(head, "GET", f"/v1/sessions/{session}/messages?limit=1000", None)
                assert len(got["messages"]) == upto, session
                memorized = lambda s=session, u=upto: call(head, "GET", f"/v1/sessions/{s}")["memorized_upto_seq"] >= u  # noqa: E731
                wait_for(memorized, 120, f"{session} memorized")
            assert len(acknowledged) == 6 and sum(acknowledged.values()) > 20
            assert len(after_kill) > 10, "the load did not go on after the worker node died"
            print(
                f"\ntwo nodes: Ingress replicas on {len(set(spread['Ingress']))} nodes; worker raylet killed, node dead after "
                f"{dead_after_s:.1f}s; {sum(acknowledged.values())} appends acknowledged ({len(after_kill)} after the kill), "
                f"{len(RETRIED)} retried attempts ({sorted(set(RETRIED))}), 0 failed; replicas after: "
                f"{ {k: len(v) for k, v in after.items()} } all on the head; every append read back and memorized"
            )
    finally:
        nodes.stop()
