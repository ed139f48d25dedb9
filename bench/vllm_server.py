"""vLLM's OpenAI-compatible server on the tiny random-weight Qwen2, as a process a caller can stop and start.

Used by tests/llm (the real `openai` serving path on CPU) and by bench/reliability.py (the LLM
endpoint it stops under load). vLLM lives in the test-only .venv-llm (scripts/llm_env.sh), so
the server runs with that venv's Python whatever Python the caller runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from serve_app.embedded.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
MODEL_ID = "tiny-qwen"
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "HF_HUB_OFFLINE": "1"}
STRUCTURED_OUTPUTS = {"backend": "xgrammar", "disable_any_whitespace": True}
LLM_VENV_PYTHON = ROOT / ".venv-llm" / "bin" / "python"


def has_vllm(python: str | Path) -> bool:
    """Whether `python` can import vllm (the main .venv cannot; .venv-llm can)."""
    if not Path(python).exists():
        return False
    probe = subprocess.run([str(python), "-c", "import importlib.util,sys; sys.exit(importlib.util.find_spec('vllm') is None)"])
    return probe.returncode == 0


def make_tiny_model(out: Path) -> str:
    """Write the tiny Qwen2 (random weights, the real Qwen2.5 tokenizer) offline; returns its directory."""
    if not (out / "config.json").exists():
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make_tiny_qwen.py"), str(out)], check=True)
    return str(out)


class OpenAIServer:
    """`python -m vllm.entrypoints.openai.api_server` on the tiny model, on a free loopback port."""

    def __init__(self, model_dir: str, log: Path, python: str | Path = sys.executable, port: int | None = None):
        self.model_dir = model_dir
        self.python = str(python)
        self.port = port or free_port()
        self.log = log
        self.process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout_s: float = 300) -> float:
        """Start and wait until /health answers; returns the seconds it took."""
        argv = [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model_dir, "--served-model-name", MODEL_ID,
            "--max-model-len", "512", "--enforce-eager", "--host", "127.0.0.1", "--port", str(self.port),
            "--structured-outputs-config", json.dumps(STRUCTURED_OUTPUTS),
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        ]  # fmt: skip
        started = time.monotonic()
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(argv, env={**os.environ, **VLLM_ENV}, stdout=log, stderr=subprocess.STDOUT)
        while time.monotonic() - started < timeout_s:
            if self.process.poll() is not None:
                raise RuntimeError("vLLM OpenAI server exited:\n" + self.log.read_text()[-3000:])
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError("vLLM OpenAI server did not start:\n" + self.log.read_text()[-3000:])

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def main() -> None:
    """Serve the tiny Qwen2 on vLLM-CPU at an OpenAI-compatible endpoint until Ctrl-C (the README's
    chat example; run with .venv-llm's python)."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--dir", type=Path, default=ROOT / ".memserve" / "tiny-qwen", help="Where the tiny model is written.")
    args = parser.parse_args()
    args.dir.parent.mkdir(parents=True, exist_ok=True)
    server = OpenAIServer(make_tiny_model(args.dir), args.dir.parent / "vllm-openai.log", port=args.port)
    print(f"vLLM OpenAI server for {MODEL_ID} at {server.base_url} in {server.start():.0f}s (log {server.log}); Ctrl-C stops it")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while server.process is not None and server.process.poll() is None:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
