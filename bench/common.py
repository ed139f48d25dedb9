"""Helpers the benchmarks share: percentiles and waiting for the memorizer over HTTP."""

from __future__ import annotations

import time

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
