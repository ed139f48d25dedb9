"""Helpers the benchmarks share: percentiles, waiting for the memorizer over HTTP, a service of their own."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from tqdm import tqdm


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile; NaN for no values."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))] if ordered else float("nan")


def wait_memorized(client: httpx.Client, last: dict[str, int], timeout_s: float = 3600) -> None:
    """Poll each session until its `memorized_upto_seq` reaches the given seq (no fixed sleeps)."""
    deadline = time.monotonic() + timeout_s
    for session, upto in tqdm(sorted(last.items()), desc="memorization", unit="session", leave=False):
        while client.get(f"/v1/sessions/{session}").json()["memorized_upto_seq"] < upto:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{session} not memorized")
            time.sleep(0.2)


@contextmanager
def memserve_up(data_dir: Path, env: dict[str, str], timeout_s: float = 300) -> Iterator[str]:
    """`memserve up` on `data_dir` and free ports, with `env` over this process's environment (the
    settings a run measures); yields its URL once healthy, stops it (and everything it started) after."""
    from serve_app.embedded.ports import free_port

    port, redis, postgres, milvus = (free_port() for _ in range(4))
    argv = [
        sys.executable, "-m", "serve_app.cli", "up", "--data-dir", str(data_dir), "--port", str(port),
        "--metrics-port", "0", "--redis-port", str(redis), "--postgres-port", str(postgres), "--milvus-port", str(milvus),
    ]  # fmt: skip
    inherited = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "REDIS_URL", "POSTGRES_DSN", "MILVUS_URI")}
    log_path = data_dir.parent / f"{data_dir.name}-memserve-up.log"
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**inherited, **env})
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"memserve up exited ({process.returncode}):\n{log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"memserve up not healthy in {timeout_s:.0f} s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        subprocess.run([sys.executable, "-m", "serve_app.cli", "down", "--data-dir", str(data_dir)], timeout=180, check=False)
        process.wait(60)
