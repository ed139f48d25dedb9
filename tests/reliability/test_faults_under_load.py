"""Faults under a steady load, end to end: `bench/reliability.py` on its own servers, checked here.

It starts its own Redis, PostgreSQL, Milvus (the embedded default), vLLM endpoint (tiny Qwen2, from .venv-llm, the
model from the machine's cache: tests/tiny_model.py) and Ray with two Ingress replicas, in a
subprocess, so killing them touches nothing the other tests use.
Time budget: about 4 minutes on a two-core machine (about 1 of them starting the servers).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.vllm_server import LLM_VENV_PYTHON, has_vllm
from tests.tiny_model import tiny_model_dir

ROOT = Path(__file__).resolve().parents[2]


def test_faults_lose_no_acknowledged_write(tmp_path):
    out = tmp_path / "reliability.json"
    argv = [sys.executable, "-m", "bench.reliability", "--clients", "4", "--down-s", "2", "--steady-s", "3"]
    argv += ["--data-dir", str(tmp_path / "data"), "--json", str(out)]
    with_llm = has_vllm(LLM_VENV_PYTHON)
    if with_llm:
        argv += ["--model-dir", str(tiny_model_dir())]
    run = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
    print(run.stdout[-4000:])
    assert out.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["failures"] == [] and run.returncode == 0, report["failures"]
    assert report["lost_total"] == 0
    tally = report["tally"]
    assert tally["unexpected_5xx"] == 0 and tally["transport_errors_outside_kills"] == 0
    assert tally["in_flight"] == tally["in_flight_ok_on_retry"]
    assert tally["documented_503"] > 0, "the backend kills must have been felt by the clients"
    injected = [f for f in report["faults"] if "skipped" not in f]
    assert len(injected) == (5 if with_llm else 4)
    assert all(f["healthy_after_s"] < 120 for f in injected)
    milvus = next(f for f in injected if "milvus" in f["fault"])
    assert milvus["vectors_before_kill"] > 0 and milvus["vectors_missing_after"] == 0
    acked = report["ledger"]
    assert acked["messages"] > 100 and acked["facts"] > 0 and acked["memories"] > 0
    probes = report["probes"]
    assert probes["cross_tenant"] >= 17 * 9 and probes["cross_tenant_leaks"] == probes["cross_tenant_changes"] == 0
    assert probes["hostile_path"] + probes["hostile_body"] > 100 and probes["hostile_5xx"] == probes["hostile_accepted"] == 0
