"""Nothing lost under faults: a steady mixed load while each backend is killed and brought back.

It starts its own servers (embedded Redis, PostgreSQL, Milvus Lite, the tiny-Qwen2 vLLM endpoint
when .venv-llm has vLLM) and its own Ray with two Ingress replicas, so it can kill them:

1. probes: hostile ids on every endpoint, and tenant B on every endpoint with tenant A's ids;
2. a steady load of clients that append (client message ids), build contexts, search, set facts
   and add memories, retrying idempotently on 503 and on errors from a kill;
3. faults in turn: kill -9 and restart Redis, PostgreSQL, then Milvus Lite (checking every vector
   written before the kill is still there), stop the LLM endpoint, `ray.kill` an Ingress replica;
4. after the load: memorization catches up, then every acknowledged write is read back.

    python -m bench.reliability [--clients 6] [--down-s 3] [--steady-s 4] [--json OUT]

Exit status 1 when an acknowledged write is lost, a 5xx other than the documented 503 (with
Retry-After) comes back outside a kill, a request in flight at a kill does not succeed on retry,
a fault is not recovered from, or a probe gets through.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from bench.probes import HOSTILE_IDS, endpoints
from bench.vllm_server import LLM_VENV_PYTHON, MODEL_ID, OpenAIServer, has_vllm, make_tiny_model
from serve_app.cli import DEFAULT_CONFIG
from serve_app.core.auth import hash_key
from serve_app.deploy.local_ray import deploy_config, ray_temp_dir, start_ray
from serve_app.deploy.serve_config import load_serve_config
from serve_app.embedded.launchers import MILVUS_ENGINES, EmbeddedBackends, Ports
from serve_app.embedded.ports import free_port

KEY_A, KEY_B = "reliability-key-a-0123456789", "reliability-key-b-0123456789"
RETRY_CAP_S = 0.5  # clients honour Retry-After up to this, to keep the run short
GIVE_UP_S = 120.0  # a request still failing after this long is reported as never succeeding
REPAIR_WAIT_S = 60.0  # for the memorizer to re-embed what a killed Milvus Lite lost
KILL_NOTICE_S = 1.0  # an attempt sent this soon after a kill may still reach the killed process
SECRET = "the vault code is 7731-SECRET"


@dataclass
class Tally:
    """What the clients saw. `in_flight` are requests whose failed attempt spanned a kill."""

    requests: int = 0
    attempts: int = 0
    ok: int = 0
    documented_503: int = 0
    degraded_reads: int = 0
    in_flight: int = 0
    in_flight_ok_on_retry: int = 0
    unexpected_5xx: int = 0
    unexpected_4xx: int = 0
    transport_errors_outside_kills: int = 0
    never_succeeded: int = 0
    by_op: Counter = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)


@dataclass
class Ledger:
    """Every write the service acknowledged with success."""

    messages: dict[str, dict[str, int]] = field(default_factory=dict)  # session -> client id -> seq
    session_user: dict[str, str] = field(default_factory=dict)
    facts: dict[tuple[str, str], str] = field(default_factory=dict)  # (user, key) -> last value
    memories: dict[str, set[str]] = field(default_factory=dict)  # user -> memory ids
    acked_at: dict[str, float] = field(default_factory=dict)  # memory id -> when acknowledged (monotonic)

    def count(self) -> dict[str, int]:
        return {
            "messages": sum(len(m) for m in self.messages.values()),
            "facts": len(self.facts),
            "memories": sum(len(m) for m in self.memories.values()),
        }


class Harness:
    def __init__(self, url: str, kills: list[float]):
        self.url = url
        self.kills = kills
        self.tally = Tally()
        self.ledger = Ledger()
        self.stop = asyncio.Event()

    def _spans_kill(self, started: float, ended: float) -> bool:
        """The attempt was cut by a kill: sent before it, or so soon after that the load balancer
        still routed it to the killed process (HAProxy takes a dead replica out within ~0.5 s)."""
        return any(started - KILL_NOTICE_S <= k <= ended + 0.05 for k in self.kills)

    async def call(self, client: httpx.AsyncClient, op: str, method: str, path: str, body: Any = None) -> httpx.Response | None:
        """Send until success, as a well-behaved client does; classify every failed attempt."""
        self.tally.requests += 1
        self.tally.by_op[op] += 1
        first = time.monotonic()
        was_in_flight = False
        while True:
            started = time.monotonic()
            self.tally.attempts += 1
            try:
                response: httpx.Response | None = await client.request(method, path, json=body)
                status = response.status_code
            except httpx.TransportError as exc:
                response, status = None, -1
                detail = repr(exc)
            ended = time.monotonic()
            if response is not None and status < 400:
                self.tally.ok += 1
                if was_in_flight:
                    self.tally.in_flight_ok_on_retry += 1
                return response
            if response is not None:
                # Serve's request id leads to the replica's traceback (logs/serve/replica_*.log).
                detail = f"{response.text[:200]} [request {response.headers.get('x-request-id', '?')}]"
            wait = 0.1
            if status == 503 and response is not None and response.headers.get("retry-after") and "detail" in response.json():
                self.tally.documented_503 += 1
                wait = min(RETRY_CAP_S, float(response.headers["retry-after"]))
            elif self._spans_kill(started, ended) and not was_in_flight:
                was_in_flight = True
                self.tally.in_flight += 1
            elif status == -1:
                self.tally.transport_errors_outside_kills += 1
                self.tally.unexpected.append(f"{op} {method} {path}: {detail}")
            elif status >= 500:
                self.tally.unexpected_5xx += 1
                self.tally.unexpected.append(f"{op} {method} {path}: {status} {detail}")
            else:
                self.tally.unexpected_4xx += 1
                self.tally.unexpected.append(f"{op} {method} {path}: {status} {detail}")
                return None
            if time.monotonic() - first > GIVE_UP_S:
                self.tally.never_succeeded += 1
                return None
            await asyncio.sleep(wait)

    async def client_loop(self, index: int) -> None:
        user = f"user-{index}"
        async with httpx.AsyncClient(base_url=self.url, timeout=30, headers={"X-API-Key": KEY_A}) as client:
            n = 0
            while not self.stop.is_set():
                n += 1
                session = f"s-{index}-{n // 40}"  # a new session every 40 rounds
                self.ledger.session_user[session] = user
                ids = [f"c{index}-{n}-q", f"c{index}-{n}-a"]
                messages = [
                    {"id": ids[0], "role": "user", "content": f"Round {n}: my order ORD-{index}{n:04d} costs ${n}.{index:02d}"},
                    {"id": ids[1], "role": "assistant", "content": f"Noted order ORD-{index}{n:04d} for round {n}."},
                ]
                r = await self.call(
                    client, "append", "POST", f"/v1/sessions/{session}/messages", {"user_id": user, "messages": messages}
                )
                if r is not None:
                    self.ledger.messages.setdefault(session, {}).update(zip(ids, r.json()["seqs"], strict=True))
                query = {"user_id": user, "session_id": session, "query": f"what did order ORD-{index}{max(1, n - 3):04d} cost?"}
                r = await self.call(client, "context", "POST", "/v1/context", {**query, "max_tokens": 2048})
                if r is not None and r.json().get("degraded"):
                    self.tally.degraded_reads += 1
                await self.call(
                    client, "search", "POST", f"/v1/users/{user}/memories/search", {"query": query["query"], "top_k": 5}
                )
                if n % 3 == 0:
                    value = f"city-{n}"
                    r = await self.call(
                        client, "fact", "PUT", f"/v1/users/{user}/facts/home", {"value": value, "category": "fact"}
                    )
                    if r is not None:
                        self.ledger.facts[(user, "home")] = value
                    memory_id = f"m-{index}-{n}"
                    body = {"id": memory_id, "text": f"User {index} noted fact number {n}"}
                    r = await self.call(client, "memory", "POST", f"/v1/users/{user}/memories", body)
                    if r is not None:
                        self.ledger.memories.setdefault(user, set()).add(memory_id)
                        self.ledger.acked_at[memory_id] = time.monotonic()


async def _list_memories(client: httpx.AsyncClient, user: str, timeout_s: float = 60) -> list[dict]:
    """Every memory of the user (Milvus), waiting out documented 503s."""
    rows: list[dict] = []
    deadline = time.monotonic() + timeout_s
    while True:
        r = await client.get(f"/v1/users/{user}/memories", params={"limit": 1000, "offset": len(rows)})
        if r.status_code == 503 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            continue
        page = r.raise_for_status().json()
        rows += page
        if len(page) < 1000:
            return rows


async def _wait_healthy(url: str, timeout_s: float = 120, in_a_row: int = 10) -> float:
    """Seconds until `in_a_row` rounds in a row pass: /healthz 200, a fact write, a memory list."""
    started = time.monotonic()
    passed = 0
    async with httpx.AsyncClient(base_url=url, timeout=10, headers={"X-API-Key": KEY_A}) as client:
        while time.monotonic() - started < timeout_s:
            try:
                ok = (await client.get("/healthz")).status_code == 200
                ok = ok and (await client.put("/v1/users/probe/facts/alive", json={"value": "1", "category": "fact"})).is_success
                ok = ok and (await client.get("/v1/users/user-0/memories", params={"limit": 1})).is_success
            except httpx.HTTPError:
                ok = False
            passed = passed + 1 if ok else 0
            if passed >= in_a_row:
                return time.monotonic() - started
            await asyncio.sleep(0.1)
    raise TimeoutError(f"service not healthy {timeout_s}s after recovery")


async def probes(url: str) -> dict[str, int]:
    """Hostile ids on every endpoint; tenant B on every endpoint with tenant A's ids."""
    out = Counter()
    async with (
        httpx.AsyncClient(base_url=url, timeout=30, headers={"X-API-Key": KEY_A}) as a,
        httpx.AsyncClient(base_url=url, timeout=30, headers={"X-API-Key": KEY_B}) as b,
    ):
        for hostile in HOSTILE_IDS:
            quoted = quote(hostile, safe="") or "%20"
            for method, path, body in endpoints(quoted, quoted):
                r = await a.request(method, path, json=body)
                out["hostile_path"] += 1
                out["hostile_5xx"] += r.status_code >= 500
                out["hostile_accepted"] += r.status_code < 400
                r = await b.request(method, path, json=body)  # the same from another tenant
                out["cross_tenant"] += 1
                out["cross_tenant_5xx"] += r.status_code >= 500
                out["hostile_accepted"] += r.status_code < 400
            for method, path, body in endpoints("s-ok", "u-ok"):
                if body is None:
                    continue
                poisoned = {**body, **{k: hostile for k in ("user_id", "session_id") if k in body}}
                if "messages" in body:
                    poisoned["messages"] = [{"role": "user", "content": "x", "id": hostile}]
                if poisoned == body:
                    continue
                r = await a.request(method, path, json=poisoned)
                out["hostile_body"] += 1
                out["hostile_5xx"] += r.status_code >= 500
                out["hostile_accepted"] += r.status_code < 400
        sid, user = "victim-session", "victim"
        await a.post(
            f"/v1/sessions/{sid}/messages", json={"user_id": user, "messages": [{"id": "v1", "role": "user", "content": SECRET}]}
        )
        (await a.put(f"/v1/users/{user}/facts/plan", json={"value": SECRET, "category": "fact"})).raise_for_status()
        (await a.post(f"/v1/users/{user}/memories", json={"id": "m1", "text": SECRET})).raise_for_status()
        before = (await a.get(f"/v1/sessions/{sid}/messages")).json()["messages"]
        for method, path, body in endpoints(sid, user):
            r = await b.request(method, path, json=body)
            out["cross_tenant"] += 1
            out["cross_tenant_5xx"] += r.status_code >= 500
            out["cross_tenant_leaks"] += "SECRET" in r.text
        after = (await a.get(f"/v1/sessions/{sid}/messages")).json()["messages"]
        fact = (await a.get(f"/v1/users/{user}/facts/plan")).json().get("value")
        kept = [m["id"] for m in await _list_memories(a, user)]
        out["cross_tenant_changes"] += (after != before) + (fact != SECRET) + ("m1" not in kept)
    return dict(out)


async def verify(url: str, ledger: Ledger, timeout_s: float = 300) -> dict[str, Any]:
    """Memorization catches up, then every acknowledged write is read back."""
    lost: Counter = Counter()
    detail: list[str] = []
    async with httpx.AsyncClient(base_url=url, timeout=60, headers={"X-API-Key": KEY_A}) as client:
        deadline = time.monotonic() + timeout_s
        for session in ledger.messages:
            while True:
                info = (await client.get(f"/v1/sessions/{session}")).raise_for_status().json()
                if info["memorized_upto_seq"] >= info["message_count"]:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"memorization of {session} stuck at {info}")
                await asyncio.sleep(0.3)
        vectors: dict[str, list[dict]] = {}
        for session, acked in ledger.messages.items():
            rows, after = [], 0
            while True:
                page = (await client.get(f"/v1/sessions/{session}/messages", params={"after": after, "limit": 1000})).json()
                rows += page["messages"]
                if page["next_after"] is None:
                    break
                after = page["next_after"]
            seqs = [m["seq"] for m in rows]
            if seqs != list(range(1, len(rows) + 1)):
                lost["gapless_violations"] += 1
                detail.append(f"{session}: seqs not gapless")
            stored = Counter(m["id"] for m in rows)
            by_id = {m["id"]: m["seq"] for m in rows}
            for msg_id, seq in acked.items():
                if by_id.get(msg_id) != seq or stored[msg_id] != 1:
                    lost["messages"] += 1
                    detail.append(f"{session}/{msg_id}: acked seq {seq}, stored {by_id.get(msg_id)} x{stored[msg_id]}")
            user = ledger.session_user[session]
            if user not in vectors:
                vectors[user] = await _list_memories(client, user)
            turn_seqs = sorted(r["seq"] for r in vectors[user] if r["session_id"] == session and r["kind"] == "turn")
            if turn_seqs != list(range(1, len(rows) + 1)):
                lost["turn_vectors"] += 1
                detail.append(f"{session}: {len(turn_seqs)} turn vectors for {len(rows)} turns")
        for (user, key), value in ledger.facts.items():
            got = (await client.get(f"/v1/users/{user}/facts/{key}")).json().get("value")
            if got != value:
                lost["facts"] += 1
                detail.append(f"fact {user}/{key}: acked {value!r}, read {got!r}")
        for user, ids in ledger.memories.items():
            present = {r["id"] for r in vectors.get(user) or await _list_memories(client, user)}
            missing = ids - present
            lost["memories"] += len(missing)
            detail.extend(f"memory {user}/{m} missing (acknowledged at {ledger.acked_at[m]:.2f})" for m in sorted(missing)[:5])
    return {"lost": dict(lost), "lost_total": sum(lost.values()), "detail": detail[:20]}


class Faults:
    """Kills and restarts, each followed by a wait for health and a steady spell."""

    def __init__(self, url: str, backends: EmbeddedBackends, llm: OpenAIServer | None, kills: list[float], args):
        self.url, self.backends, self.llm, self.kills, self.args = url, backends, llm, kills, args
        self.results: list[dict[str, Any]] = []

    async def backend(self, name: str) -> None:
        before: dict[str, set[str]] = {}
        if name == "milvus":
            async with httpx.AsyncClient(base_url=self.url, timeout=60, headers={"X-API-Key": KEY_A}) as client:
                for i in range(self.args.clients):
                    before[f"user-{i}"] = {r["id"] for r in await _list_memories(client, f"user-{i}")}
        self.kills.append(time.monotonic())
        killed_at = self.kills[-1]
        await asyncio.to_thread(self.backends.backends[name].kill)
        await asyncio.sleep(self.args.down_s)
        restarting = time.monotonic()
        await asyncio.to_thread(self.backends.restart, name)
        result: dict[str, Any] = {"fault": f"kill -9 {name}, restart", "at": round(killed_at, 2), "down_s": self.args.down_s}
        result["restart_s"] = round(time.monotonic() - restarting, 2)
        result["healthy_after_s"] = round(await _wait_healthy(self.url), 2)
        if name == "milvus":
            # Milvus Lite may lose what it acknowledged just before the kill; the memorizer re-embeds
            # it from PostgreSQL (vector_repair). Count what is missing until the repair is done.
            async with httpx.AsyncClient(base_url=self.url, timeout=60, headers={"X-API-Key": KEY_A}) as client:

                async def missing() -> int:
                    gone = 0
                    for user, ids in before.items():
                        gone += len(ids - {r["id"] for r in await _list_memories(client, user)})
                    return gone

                repairing = time.monotonic()
                result["vectors_missing_at_restart"] = left = await missing()
                while left and time.monotonic() - repairing < REPAIR_WAIT_S:
                    await asyncio.sleep(1.0)
                    left = await missing()
                if result["vectors_missing_at_restart"]:
                    result["repaired_after_s"] = round(time.monotonic() - repairing, 2)
            result["vectors_before_kill"] = sum(len(v) for v in before.values())
            result["vectors_missing_after"] = left
        self.results.append(result)
        await asyncio.sleep(self.args.steady_s)

    async def llm_endpoint(self) -> None:
        if self.llm is None:
            self.results.append({"fault": "stop the LLM endpoint", "skipped": "no vLLM in .venv-llm"})
            return
        await asyncio.to_thread(self.llm.stop)
        await asyncio.sleep(self.args.down_s * 2)  # the load goes on without it: summaries degrade, extraction waits
        self.results.append(
            {
                "fault": "stop the LLM endpoint",
                "down_s": self.args.down_s * 2,
                "healthy_after_s": round(await _wait_healthy(self.url), 2),
            }
        )
        await asyncio.sleep(self.args.steady_s)

    async def ingress_replica(self) -> None:
        import ray
        from ray import serve

        replicas = [
            a for a in ray.util.list_named_actors(all_namespaces=True) if "SERVE_REPLICA" in a["name"] and "Ingress" in a["name"]
        ]
        victim = ray.get_actor(replicas[0]["name"], namespace=replicas[0]["namespace"])
        self.kills.append(time.monotonic())
        ray.kill(victim, no_restart=True)
        started = time.monotonic()
        healthy = await _wait_healthy(self.url)
        while True:  # the controller notices and starts a replacement
            states = serve.status().applications["memserve"].deployments["Ingress"].replica_states
            if states.get("RUNNING", 0) >= 2 or time.monotonic() - started > 180:
                break
            await asyncio.sleep(0.5)
        self.results.append(
            {
                "fault": "ray.kill an Ingress replica (of 2)",
                "at": round(self.kills[-1], 2),
                "healthy_after_s": round(healthy, 2),
                "replaced_after_s": round(time.monotonic() - started, 2),
                "replicas_running": states.get("RUNNING", 0),
            }
        )
        await asyncio.sleep(self.args.steady_s)


def _serve_config(port: int, llm: OpenAIServer | None):
    config = load_serve_config(DEFAULT_CONFIG, host="127.0.0.1", port=port)
    args: dict[str, Any] = {
        "api_keys": {hash_key(KEY_A): "tenant-a", hash_key(KEY_B): "tenant-b"},
        "compaction_trigger_tokens": 400,
        "memorizer_sweep_interval_s": 0.2,
    }
    if llm is not None:
        args |= {
            "llm_mode": "openai",
            "llm_base_url": llm.base_url,
            "llm_model": MODEL_ID,
            "llm_timeout_s": 20,
            "llm_input_tokens": 120,
            "summary_max_tokens": 64,
            "llm_extract_max_tokens": 200,
            "extraction_max_facts": 1,
        }
    config.applications[0].args = args
    for deployment in config.applications[0].deployments:
        if deployment.name == "Ingress":
            deployment.num_replicas = 2
    return config


async def _run(args, url: str, backends: EmbeddedBackends, llm: OpenAIServer | None) -> dict[str, Any]:
    from tqdm import tqdm

    probe_counts = await probes(url)
    kills: list[float] = []
    harness = Harness(url, kills)
    clients = [asyncio.create_task(harness.client_loop(i)) for i in range(args.clients)]
    faults = Faults(url, backends, llm, kills, args)
    steps = [
        ("warm-up", lambda: asyncio.sleep(args.steady_s)),
        ("redis", lambda: faults.backend("redis")),
        ("postgres", lambda: faults.backend("postgres")),
        ("milvus", lambda: faults.backend("milvus")),
        ("llm", faults.llm_endpoint),
        ("ingress replica", faults.ingress_replica),
    ]
    try:
        for name, step in tqdm(steps, desc="faults", unit="fault"):
            tqdm.write(f"{time.strftime('%H:%M:%S')} {name}")
            await step()
    finally:
        harness.stop.set()
        await asyncio.gather(*clients)
    checked = await verify(url, harness.ledger)
    return {"probes": probe_counts, "tally": harness.tally, "ledger": harness.ledger.count(), "faults": faults.results, **checked}


def _table(report: dict[str, Any]) -> str:
    t: Tally = report["tally"]
    p = report["probes"]
    faults = report["faults"]
    survived = [f for f in faults if "skipped" not in f and f.get("vectors_missing_after", 0) == 0]
    injected = [f for f in faults if "skipped" not in f]
    acked = report["ledger"]
    rows = [
        ("requests under load", f"{t.requests} ({t.attempts} attempts; {dict(t.by_op)})"),
        ("  answered 2xx / documented 503 (Retry-After)", f"{t.ok} / {t.documented_503}"),
        ("  reads answered degraded", f"{t.degraded_reads}"),
        ("faults injected / survived", f"{len(injected)} / {len(survived)}"),
    ]
    for f in faults:
        extra = ", ".join(f"{k} {v}" for k, v in f.items() if k != "fault")
        rows.append((f"  {f['fault']}", extra))
    rows += [
        ("in-flight requests at kills / ok on retry", f"{t.in_flight} / {t.in_flight_ok_on_retry}"),
        (
            "hostile inputs tried (5xx, accepted)",
            f"{p['hostile_path'] + p['hostile_body']} ({p['hostile_5xx']}, {p['hostile_accepted']})",
        ),
        (
            "cross-tenant attempts (leaks, changes, 5xx)",
            f"{p['cross_tenant']} ({p['cross_tenant_leaks']}, {p['cross_tenant_changes']}, {p['cross_tenant_5xx']})",
        ),
        ("acknowledged writes", ", ".join(f"{k} {v}" for k, v in acked.items())),
        ("acknowledged writes lost", f"{report['lost_total']} { {k: v for k, v in report['lost'].items() if v} or '' }"),
        ("unexpected 5xx responses", f"{t.unexpected_5xx + t.transport_errors_outside_kills}"),
        ("unexpected 4xx / never succeeded", f"{t.unexpected_4xx} / {t.never_succeeded}"),
    ]
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def _failures(report: dict[str, Any]) -> list[str]:
    t: Tally = report["tally"]
    p = report["probes"]
    checks = {
        "acknowledged writes lost": report["lost_total"],
        "unexpected 5xx": t.unexpected_5xx + t.transport_errors_outside_kills,
        "unexpected 4xx": t.unexpected_4xx,
        "requests that never succeeded": t.never_succeeded,
        "in-flight requests not ok on retry": t.in_flight - t.in_flight_ok_on_retry,
        "vectors missing after the Milvus restart": sum(f.get("vectors_missing_after", 0) for f in report["faults"]),
        "hostile inputs with 5xx or accepted": p["hostile_5xx"] + p["hostile_accepted"],
        "cross-tenant leaks, changes or 5xx": p["cross_tenant_leaks"] + p["cross_tenant_changes"] + p["cross_tenant_5xx"],
    }
    return [f"{name}: {value}" for name, value in checks.items() if value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=6, help="Concurrent clients of the steady load.")
    parser.add_argument("--down-s", type=float, default=3.0, help="How long each killed backend stays down.")
    parser.add_argument("--steady-s", type=float, default=4.0, help="Load before the first fault and after each recovery.")
    parser.add_argument("--data-dir", type=Path, default=None, help="Where its servers keep data (default: a temp dir).")
    parser.add_argument("--llm-python", type=Path, default=LLM_VENV_PYTHON, help="A Python with vLLM for the LLM endpoint.")
    parser.add_argument("--model-dir", type=Path, default=None, help="The tiny Qwen2, built (default: built in the data dir).")
    parser.add_argument("--json", type=Path, default=None, help="Write the figures here.")
    parser.add_argument("--milvus-engine", choices=MILVUS_ENGINES, default=MILVUS_ENGINES[0], help="Embedded Milvus to kill.")
    args = parser.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for var in ("RAY_ADDRESS", "REDIS_URL", "POSTGRES_DSN", "MILVUS_URI"):
        os.environ.pop(var, None)
    data_dir = (args.data_dir or Path(tempfile.mkdtemp(prefix="memserve-reliability-"))).resolve()
    backends = EmbeddedBackends(data_dir / "backends", Ports.free(), milvus_engine=args.milvus_engine).start()
    llm = None
    started = time.monotonic()
    try:
        if has_vllm(args.llm_python):
            model = str(args.model_dir) if args.model_dir else make_tiny_model(data_dir / "tiny-qwen")
            llm = OpenAIServer(model, data_dir / "vllm.log", python=args.llm_python)
            print(f"LLM endpoint (vLLM, tiny Qwen2) up in {llm.start():.0f}s", flush=True)
        else:
            print(f"no vLLM at {args.llm_python}: the LLM fault is skipped (bash scripts/llm_env.sh makes one)", flush=True)
        os.environ.update(backends.app_env)
        port = free_port()
        start_ray(ray_temp_dir(data_dir))
        deploy_config(_serve_config(port, llm))
        report = asyncio.run(_run(args, f"http://127.0.0.1:{port}", backends, llm))
    finally:
        import ray
        from ray import serve

        if ray.is_initialized():
            serve.shutdown()
            ray.shutdown()
        if llm is not None:
            llm.stop()
        backends.stop()
    report["seconds"] = round(time.monotonic() - started, 1)
    print()
    print(_table(report))
    for line in report["tally"].unexpected[:20]:
        print("  unexpected:", line)
    if report["tally"].unexpected:
        print(f"  (their tracebacks: {ray_temp_dir(data_dir)}/session_latest/logs/serve/replica_*.log, by request id)")
    for line in report["detail"]:
        print("  lost:", line)
    failures = _failures(report)
    print(f"\n{'FAIL: ' + '; '.join(failures) if failures else 'PASS'} ({report['seconds']} s)")
    if args.json:
        tally = report["tally"]
        out = {**report, "tally": {**tally.__dict__, "by_op": dict(tally.by_op)}, "failures": failures}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2, default=str))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
