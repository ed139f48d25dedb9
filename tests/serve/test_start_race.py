"""A start does not race: a port HAProxy was to bind, taken by another process after it was found
free, costs `memserve up` a second start on fresh ports, not its start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_side_port_taken_before_haproxy_binds_it_costs_a_retry_not_the_start():
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-m", "tests.serve.port_race"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    assert run.returncode == 0, run.stderr[-3000:]
    outcome = json.loads(run.stdout.strip().splitlines()[-1])
    assert outcome["taken"] is not None
    assert outcome.get("answer") == "hello", outcome.get("error") or run.stderr[-3000:]
    assert outcome["starts"] == 2
    assert f"port {outcome['taken']}, chosen for HAProxy, was taken" in run.stderr
