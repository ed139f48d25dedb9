"""Autoscaling, exercised: the app on embedded stores with autoscaling on the Ingress, the Embedder
and the Memorizer, under a bounded load that rises, holds and stops.

    python -m bench.autoscale --json bench/out/autoscale.json      # about 6 minutes

It starts the stores and Ray as `memserve up` does (same launchers, same `configs/local.yaml`),
but deploys a test variant of that config: Ingress and Embedder autoscale from 1 to 3 replicas on
ongoing requests, with short up- and downscale delays; the Memorizer from 1 to 3 on its backlog
(`serve_app.deploy.autoscaling:MemorizerBacklogPolicy`: sessions waiting in the embedding lane and
memorization lag, recorded by each replica). Every replica gets a small CPU share so three of
each fit on two cores.

Load: closed-loop aiohttp workers, each appending one turn (with a client id) to sessions of its
own and asking for a context in between; the workers step up, hold, then stop. Every half second
the run reads Serve's own status (`serve.status()`: RUNNING replicas per deployment) and the
embedding lane. After the load it waits for the replicas to come back down and the memorizer to
catch up, then reads every acknowledged append back.

Then, with `--saturation`, one replica's saturation curve: the Ingress pinned at one replica under
context requests at rising concurrency, and the Embedder's `embed_many` called through its handle
at rising concurrency, each a table of latency and throughput against ongoing requests (the
figures `configs/cluster.yaml`'s `target_ongoing_requests` are set from).

Prints tables, writes JSON and a PNG (replicas over time beside the load).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml
from tqdm import tqdm

from bench.common import percentile

ROOT = Path(__file__).resolve().parent.parent
DEPLOYMENTS = ("Ingress", "Embedder", "Memorizer")
STEPS = ((20, 4), (15, 12), (15, 24), (40, 40), (0, 0))  # (seconds, workers): rise, hold, stop
DOWN_WAIT_S = 120


def autoscaling_config(path: Path, port: int) -> Path:
    """configs/local.yaml with autoscaling on the three deployments, written beside the data."""
    raw = yaml.safe_load((ROOT / "configs" / "local.yaml").read_text())
    fast = {"metrics_interval_s": 0.5, "look_back_period_s": 2, "upscale_delay_s": 2, "downscale_delay_s": 10}
    targets = {"Ingress": 4, "Embedder": 2}
    for deployment in raw["applications"][0]["deployments"]:
        name = deployment["name"]
        deployment.pop("num_replicas", None)
        deployment["ray_actor_options"] = {"num_cpus": 0.2}
        scaling = {"min_replicas": 1, "max_replicas": 3, **fast}
        if name == "Memorizer":
            scaling["policy"] = {
                "policy_function": "serve_app.deploy.autoscaling:MemorizerBacklogPolicy",
                "policy_kwargs": {"sessions_per_replica": 8, "target_lag_s": 2},
            }
        else:
            scaling["target_ongoing_requests"] = targets[name]
        deployment["autoscaling_config"] = scaling
    raw["http_options"]["port"] = port
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@dataclass
class Load:
    url: str
    user: str
    workers: int = 0
    ok: int = 0
    failed: list[str] = field(default_factory=list)
    acknowledged: dict[str, int] = field(default_factory=dict)  # session -> last acknowledged seq
    latencies_ms: list[float] = field(default_factory=list)
    done_at: list[float] = field(default_factory=list)

    async def worker(self, index: int, session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        turn = 0
        while not stop.is_set() and index < self.workers:
            sid = f"{self.user}-w{index}-{turn // 6}"  # a new session every six turns: lane work
            text = f"worker {index} says note {turn} about P-{turn % 23}"
            append = {"user_id": self.user, "messages": [{"role": "user", "content": text, "id": f"{index}.{turn}"}]}
            await self._call(session, "POST", f"/v1/sessions/{sid}/messages", append, sid)
            context = {"user_id": self.user, "session_id": sid, "query": f"what about P-{turn % 23}?", "max_tokens": 2048}
            await self._call(session, "POST", "/v1/context", context, None)
            turn += 1

    async def _call(self, session: aiohttp.ClientSession, method: str, path: str, body: dict, sid: str | None) -> None:
        started = time.perf_counter()
        try:
            async with session.request(method, self.url + path, json=body) as response:
                payload = await response.json()
                if response.status >= 400:
                    self.failed.append(f"{response.status} {path}: {str(payload)[:200]}")
                    return
        except Exception as exc:  # a refused connection during a scale-down is what this run looks for
            self.failed.append(f"{type(exc).__name__} {path}: {exc}")
            return
        self.ok += 1
        self.latencies_ms.append((time.perf_counter() - started) * 1000)
        self.done_at.append(time.monotonic())
        if sid is not None:
            self.acknowledged[sid] = max(self.acknowledged.get(sid, 0), payload["seqs"][-1])


async def replica_counts() -> dict[str, int]:
    from ray import serve
    from ray.serve._private.common import ReplicaState

    status = await asyncio.to_thread(serve.status)
    app = status.applications["memserve"]
    return {name: app.deployments[name].replica_states.get(ReplicaState.RUNNING, 0) for name in DEPLOYMENTS}


async def run_load(url: str, log, samples: list[dict]) -> Load:
    load = Load(url, "scale-" + uuid.uuid4().hex[:6])
    stop = asyncio.Event()
    started = time.monotonic()

    async def sample() -> None:
        while True:
            counts = await replica_counts()
            waiting, _ = await log.lane_sizes()
            samples.append({"t": round(time.monotonic() - started, 2), "workers": load.workers, **counts, "waiting": waiting})
            await asyncio.sleep(0.5)

    sampler = asyncio.create_task(sample())
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        tasks: list[asyncio.Task] = []
        for seconds, workers in tqdm(STEPS, desc="load steps", unit="step"):
            load.workers = workers
            tasks += [asyncio.create_task(load.worker(i, session, stop)) for i in range(len(tasks), workers)]
            await asyncio.sleep(seconds)
        stop.set()
        await asyncio.gather(*tasks)
    load.stopped_at = round(time.monotonic() - started, 2)  # type: ignore[attr-defined]
    deadline = time.monotonic() + DOWN_WAIT_S
    while time.monotonic() < deadline:
        counts = await replica_counts()
        if all(n == 1 for n in counts.values()) and samples and samples[-1]["waiting"] == 0:
            break
        await asyncio.sleep(1)
    await asyncio.sleep(2)
    sampler.cancel()
    return load


async def read_back(url: str, load: Load) -> list[str]:
    """Every acknowledged turn is in its session and memorized."""
    lost = []
    async with aiohttp.ClientSession() as session:
        for sid, upto in tqdm(sorted(load.acknowledged.items()), desc="read back", unit="session"):
            for _ in range(600):
                async with session.get(f"{url}/v1/sessions/{sid}") as response:
                    meta = await response.json()
                if meta["memorized_upto_seq"] >= upto:
                    break
                await asyncio.sleep(0.2)
            async with session.get(f"{url}/v1/sessions/{sid}/messages", params={"limit": 1000}) as response:
                got = len((await response.json())["messages"])
            if got < upto or meta["memorized_upto_seq"] < upto:
                lost.append(f"{sid}: {got} stored, {meta['memorized_upto_seq']} memorized of {upto}")
    return lost


async def closed_loop(level: int, seconds: float, request) -> dict:
    """`level` callers, each sending `request(caller, n)` again as soon as it answered."""
    latencies: list[float] = []
    until = time.monotonic() + seconds

    async def caller(i: int) -> None:
        n = 0
        while time.monotonic() < until:
            started = time.perf_counter()
            await request(i, n)
            latencies.append((time.perf_counter() - started) * 1000)
            n += 1

    await asyncio.gather(*(caller(i) for i in range(level)))
    return _point(level, latencies, seconds)


async def saturation(url: str, user: str) -> dict[str, list[dict]]:
    """Latency and throughput against ongoing requests, one replica each (8 s per level)."""
    from ray import serve

    levels = (1, 2, 4, 8, 16, 32, 64)
    curves: dict[str, list[dict]] = {"Ingress (POST /v1/context)": [], "Embedder (embed_many, 8 texts)": []}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def context(i: int, n: int) -> None:
            query = f"note {i}.{n} about P-{n % 23}?"
            body = {"user_id": user, "session_id": f"{user}-sat", "query": query, "max_tokens": 2048}
            async with session.post(f"{url}/v1/context", json=body) as response:
                await response.read()

        for level in tqdm(levels, desc="ingress saturation", unit="level"):
            curves["Ingress (POST /v1/context)"].append(await closed_loop(level, 8, context))
    embedder = serve.get_deployment_handle("Embedder", "memserve")

    async def embed(i: int, n: int) -> None:
        await embedder.embed_many.remote([f"turn {i}.{n}.{k}: the review of P-{k} moved to Friday" for k in range(8)])

    for level in tqdm(levels, desc="embedder saturation", unit="level"):
        curves["Embedder (embed_many, 8 texts)"].append(await closed_loop(level, 8, embed))
    return curves


def _point(level: int, latencies: list[float], seconds: float) -> dict:
    return {
        "ongoing": level,
        "p50_ms": round(percentile(latencies, 50), 1),
        "p95_ms": round(percentile(latencies, 95), 1),
        "per_s": round(len(latencies) / seconds, 1),
    }


def plot(samples: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    t = [s["t"] for s in samples]
    for name in DEPLOYMENTS:
        top.step(t, [s[name] for s in samples], where="post", label=name)
    top.set_ylabel("RUNNING replicas (serve.status)")
    top.set_yticks([0, 1, 2, 3])
    top.legend(loc="upper right")
    bottom.step(t, [s["workers"] for s in samples], where="post", label="closed-loop workers", color="black")
    bottom.plot(t, [s["waiting"] for s in samples], label="sessions waiting in the embedding lane", color="tab:red")
    bottom.set_xlabel("seconds")
    bottom.legend(loc="upper right")
    fig.suptitle("Autoscaling under a rising, holding and stopping load (bench.autoscale)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", dest="json_out", default="bench/out/autoscale.json")
    parser.add_argument("--saturation", action="store_true", help="Also measure one replica's saturation curve.")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from serve_app.deploy.local_ray import deploy_config, ray_temp_dir, start_ray
    from serve_app.deploy.serve_config import load_serve_config
    from serve_app.embedded.launchers import EmbeddedBackends, Ports
    from serve_app.embedded.ports import free_listen_port
    from serve_app.stores.session_log import SessionLog

    data = Path(tempfile.mkdtemp(prefix="memserve-autoscale-"))
    backends = EmbeddedBackends(data, Ports.free()).start()
    try:
        os.environ.update(backends.app_env)
        port = free_listen_port("127.0.0.1")
        start_ray(ray_temp_dir(data))
        deploy_config(load_serve_config(autoscaling_config(data / "autoscale.yaml", port)))
        url = f"http://127.0.0.1:{port}"

        async def autoscaled() -> dict:
            log = SessionLog(backends.env["REDIS_URL"], 3600)
            samples: list[dict] = []
            load = await run_load(url, log, samples)
            lost = await read_back(url, load)
            await log.close()
            return {"samples": samples, "load": load, "lost": lost, "curves": {}}

        result = asyncio.run(autoscaled())
        if args.saturation:  # the shipped local profile: one replica of each
            deploy_config(load_serve_config(ROOT / "configs" / "local.yaml", port=port))
            result["curves"] = asyncio.run(saturation(url, result["load"].user))
        report(result, Path(args.json_out))
    finally:
        import ray
        from ray import serve

        try:
            if ray.is_initialized():
                try:
                    serve.shutdown()
                except RuntimeError:  # a handle of an event loop that asyncio.run already closed
                    pass
                ray.shutdown()
        finally:  # the stores are this run's own: never left running, whatever Ray did
            backends.stop()


def report(result: dict, json_out: Path) -> None:
    samples, load, lost, curves = result["samples"], result["load"], result["lost"], result["curves"]
    print("\nreplicas over time (Serve status, RUNNING), every 5 s")
    print(f"{'t s':>6} {'workers':>8} " + " ".join(f"{n:>10}" for n in DEPLOYMENTS) + f" {'waiting':>8}")
    next_t = 0.0
    for s in samples:
        if s["t"] >= next_t:
            print(f"{s['t']:>6.1f} {s['workers']:>8} " + " ".join(f"{s[n]:>10}" for n in DEPLOYMENTS) + f" {s['waiting']:>8}")
            next_t += 5
    peak = {n: max(s[n] for s in samples) for n in DEPLOYMENTS}
    last = {n: samples[-1][n] for n in DEPLOYMENTS}
    print(f"\npeak replicas {peak}; after the load {last}; load stopped at {load.stopped_at} s")
    print(f"requests ok {load.ok}, failed {len(load.failed)}; acknowledged appends not read back: {len(lost)}")
    for line in (load.failed + lost)[:10]:
        print("  ", line)
    print(f"request p50 {percentile(load.latencies_ms, 50):.1f} ms, p99 {percentile(load.latencies_ms, 99):.1f} ms")
    for name, points in curves.items():
        print(f"\nsaturation of one replica: {name}")
        print(f"{'ongoing':>8} {'p50 ms':>8} {'p95 ms':>8} {'per s':>8}")
        for p in points:
            print(f"{p['ongoing']:>8} {p['p50_ms']:>8} {p['p95_ms']:>8} {p['per_s']:>8}")
    json_out.parent.mkdir(parents=True, exist_ok=True)
    figures = {
        "samples": samples,
        "peak": peak,
        "after": last,
        "ok": load.ok,
        "failed": load.failed,
        "lost": lost,
        "acknowledged_sessions": len(load.acknowledged),
        "curves": curves,
    }
    json_out.write_text(json.dumps(figures, indent=2))
    plot(samples, json_out.with_suffix(".png"))
    print(f"\nwrote {json_out} and {json_out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
