"""The real LLM serving path on CPU: vLLM (vllm-cpu) with a tiny random-weight Qwen2 built offline.

These tests run in .venv-llm (scripts/llm_env.sh): `scripts/test.sh` runs them there. Only the model
is small; the deployment, handles, streaming, guided decoding and OpenAI server are the real ones.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from serve_app.embedded.launchers import free_port

ROOT = Path(__file__).resolve().parents[2]
MODEL_ID = "tiny-qwen"
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "HF_HUB_OFFLINE": "1"}
STRUCTURED_OUTPUTS = {"backend": "xgrammar", "disable_any_whitespace": True}

if importlib.util.find_spec("vllm") is None:  # collected by the main venv's run: nothing to do there
    collect_ignore_glob = ["test_*.py"]


def tiny_llm_config(model_dir: str) -> dict:
    """LLMConfig fields for the tiny model: the recipe of configs/cluster.yaml, sized for two cores."""
    return {
        "model_loading_config": {"model_id": MODEL_ID, "model_source": model_dir},
        "engine_kwargs": {"enforce_eager": True, "max_model_len": 512, "structured_outputs_config": STRUCTURED_OUTPUTS},
        "placement_group_config": {"bundles": [{"CPU": 1}]},
        "runtime_env": {"env_vars": dict(VLLM_ENV)},
    }


@pytest.fixture(scope="session")
def tiny_model(data_root) -> str:
    out = data_root / "tiny-qwen"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_tiny_qwen.py"), str(out)], check=True)
    return str(out)


class OpenAIServer:
    """vLLM's OpenAI-compatible server on the tiny model, which a test can stop and start."""

    def __init__(self, model_dir: str, log: Path):
        self.model_dir = model_dir
        self.port = free_port()
        self.log = log
        self.process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout_s: float = 300) -> float:
        argv = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model_dir, "--served-model-name", MODEL_ID,
            "--max-model-len", "512", "--enforce-eager", "--host", "127.0.0.1", "--port", str(self.port),
            "--structured-outputs-config", json.dumps(STRUCTURED_OUTPUTS),
        ]  # fmt: skip
        started = time.monotonic()
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(argv, env={**os.environ, **VLLM_ENV}, stdout=log, stderr=subprocess.STDOUT)
        while time.monotonic() - started < timeout_s:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise AssertionError("vLLM OpenAI server did not start:\n" + self.log.read_text()[-3000:])

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


@pytest.fixture(scope="session")
def openai_server(tiny_model, data_root):
    server = OpenAIServer(tiny_model, data_root / "vllm-openai.log")
    print(f"\nvLLM OpenAI server started in {server.start():.1f}s")
    yield server
    server.stop()
