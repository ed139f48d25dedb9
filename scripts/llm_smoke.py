#!/usr/bin/env python3
"""Smoke check: a tiny random-weight Qwen2 served by vLLM on CPU, via Ray Serve LLM or vLLM's own
OpenAI server. Run it with the .venv-llm interpreter (scripts/llm_env.sh creates it):

    .venv-llm/bin/python scripts/llm_smoke.py --mode serve    # ray.serve.llm.build_llm_deployment + handle
    .venv-llm/bin/python scripts/llm_smoke.py --mode openai   # python -m vllm.entrypoints.openai.api_server

It builds the model with scripts/make_tiny_qwen.py (unless --model-dir holds one), deploys it,
sends a plain chat request and one with a JSON-schema response_format, checks the JSON against
the schema, and prints timings and peak memory. Exit status 0 means every check passed.
For tests only: nothing here downloads anything (HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODEL_ID = "tiny-qwen"
# Keep vLLM's CPU KV cache small (GiB), don't pin OpenMP threads to cores, never touch the hub.
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "HF_HUB_OFFLINE": "1"}
# Strings bounded by maxLength so that a random model must close them; xgrammar with
# disable_any_whitespace then leaves it no way to pad, and it stops after the closing brace.
SCHEMA = {
    "type": "object",
    "properties": {
        "summary": {"type": "string", "maxLength": 24},
        "importance": {"type": "integer", "minimum": 0, "maximum": 10},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["summary", "importance", "tags"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "memory_note", "schema": SCHEMA, "strict": True}}
MESSAGES = [
    {"role": "system", "content": "You extract memory notes as JSON."},
    {"role": "user", "content": "Remember that my favourite colour is teal."},
]
# Engine-level only: vLLM 0.32's xgrammar backend reads disable_any_whitespace from the engine's
# structured_outputs_config; a per-request structured_outputs.disable_any_whitespace is ignored, and
# without it the random model emits whitespace inside the JSON until max_tokens.
STRUCTURED_OUTPUTS = {"backend": "xgrammar", "disable_any_whitespace": True}


class PeakMemory:
    """Samples system-wide used memory and the RSS of this process tree every 0.2 s."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self.base_used = psutil.virtual_memory().used
        self.peak_used = self.base_used
        self.peak_tree_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        me = self._psutil.Process()
        while not self._stop.wait(0.2):
            self.peak_used = max(self.peak_used, self._psutil.virtual_memory().used)
            rss = 0
            for p in [me, *me.children(recursive=True)]:
                try:
                    rss += p.memory_info().rss
                except self._psutil.Error:
                    pass
            self.peak_tree_rss = max(self.peak_tree_rss, rss)

    def report(self) -> str:
        self._stop.set()
        self._thread.join()
        gib = 1 << 30
        return (
            f"peak memory: system used +{(self.peak_used - self.base_used) / gib:.2f} GiB over start "
            f"({self.peak_used / gib:.2f} GiB total); process tree RSS peak {self.peak_tree_rss / gib:.2f} GiB"
        )


def ensure_model(model_dir: str | None) -> str:
    if model_dir and (Path(model_dir) / "config.json").is_file():
        return model_dir
    out = model_dir or tempfile.mkdtemp(prefix="tiny-qwen-")
    subprocess.run([sys.executable, str(HERE / "make_tiny_qwen.py"), out], check=True)
    return out


def check_json(text: str) -> dict:
    import jsonschema

    obj = json.loads(text)
    jsonschema.validate(obj, SCHEMA)
    return obj


def run_serve(model_dir: str, args: argparse.Namespace) -> None:
    import ray
    from ray import serve
    from ray.serve.llm import LLMConfig, build_llm_deployment
    from ray.serve.llm.openai_api_models import ChatCompletionRequest

    # What comes back is vLLM's own ChatCompletionResponse, not the ray.serve.llm.openai_api_models
    # subclass of the same name (isinstance against that one is False).
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionResponse

    ray.init(num_cpus=2, _temp_dir=args.ray_temp_dir, include_dashboard=False, log_to_driver=args.verbose)
    try:
        llm_config = LLMConfig(
            model_loading_config={"model_id": MODEL_ID, "model_source": model_dir},
            engine_kwargs={
                "enforce_eager": True,
                "max_model_len": 512,
                "structured_outputs_config": STRUCTURED_OUTPUTS,
            },
            placement_group_config={"bundles": [{"CPU": 1}]},
            runtime_env={"env_vars": dict(VLLM_ENV)},
        )
        app = build_llm_deployment(llm_config)
        t0 = time.monotonic()
        handle = serve.run(app, name="tiny-qwen-llm", route_prefix=None)
        print(f"[serve] deploy time: {time.monotonic() - t0:.1f} s", flush=True)

        def chat(**kw) -> ChatCompletionResponse:
            request = ChatCompletionRequest(model=MODEL_ID, messages=MESSAGES, **kw)
            # LLMServer.chat is an async generator: with request.stream False it yields one
            # ChatCompletionResponse (or an ErrorResponse); handle needs stream=True to iterate.
            results = list(handle.options(stream=True).chat.remote(request))
            if len(results) != 1 or not isinstance(results[0], ChatCompletionResponse):
                raise SystemExit(f"[serve] unexpected chat result: {results!r}")
            return results[0]

        print(f"[serve] result type: {ChatCompletionResponse.__module__}.{ChatCompletionResponse.__qualname__}")

        t0 = time.monotonic()
        resp = chat(max_tokens=16, temperature=1.0, seed=1)
        print(
            f"[serve] first response: {time.monotonic() - t0:.2f} s, finish_reason={resp.choices[0].finish_reason}, "
            f"usage={resp.usage.prompt_tokens}+{resp.usage.completion_tokens} tokens, text={resp.choices[0].message.content!r}"
        )

        t0 = time.monotonic()
        resp = chat(max_tokens=200, response_format=RESPONSE_FORMAT, temperature=1.0, seed=2)
        dt = time.monotonic() - t0
        choice = resp.choices[0]
        print(
            f"[serve] json_schema response: {dt:.2f} s, finish_reason={choice.finish_reason}, "
            f"completion_tokens={resp.usage.completion_tokens}"
        )
        print(f"[serve] JSON: {choice.message.content}")
        obj = check_json(choice.message.content)
        if choice.finish_reason != "stop":
            raise SystemExit(f"[serve] JSON output did not stop by itself: {choice.finish_reason}")
        print(f"[serve] schema-valid: {obj}")

        # Streaming: request.stream=True makes the deployment yield lists of SSE strings.
        t0 = time.monotonic()
        request = ChatCompletionRequest(model=MODEL_ID, messages=MESSAGES, max_tokens=8, stream=True)
        chunks = [c for batch in handle.options(stream=True).chat.remote(request) for c in batch]
        if not chunks or not all(isinstance(c, str) and c.startswith("data: ") for c in chunks):
            raise SystemExit(f"[serve] unexpected stream chunks: {chunks[:3]!r}")
        print(f"[serve] stream=True: {len(chunks)} SSE chunks in {time.monotonic() - t0:.2f} s, last={chunks[-1].strip()!r}")
    finally:
        serve.shutdown()
        ray.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def run_openai(model_dir: str, args: argparse.Namespace) -> None:
    port = args.port or free_port()
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model_dir,
        "--served-model-name",
        MODEL_ID,
        "--max-model-len",
        "512",
        "--enforce-eager",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--structured-outputs-config",
        json.dumps(STRUCTURED_OUTPUTS),
    ]
    env = {**os.environ, **VLLM_ENV}
    print("[openai] " + " ".join(cmd), flush=True)
    log = open(args.log, "w") if args.log else None
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=log or (None if args.verbose else subprocess.DEVNULL), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"[openai] server exited with {proc.returncode} (see --log / --verbose)")
            if time.monotonic() - t0 > args.timeout:
                raise SystemExit("[openai] server not healthy in time")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        print(f"[openai] server healthy after {time.monotonic() - t0:.1f} s on port {port}", flush=True)

        models = json.loads(urllib.request.urlopen(base + "/v1/models", timeout=10).read())
        print(f"[openai] /v1/models: {[m['id'] for m in models['data']]}")

        t0 = time.monotonic()
        resp = post(base + "/v1/chat/completions", {"model": MODEL_ID, "messages": MESSAGES, "max_tokens": 16, "seed": 1})
        c = resp["choices"][0]
        print(
            f"[openai] first response: {time.monotonic() - t0:.2f} s, finish_reason={c['finish_reason']}, "
            f"usage={resp['usage']}, text={c['message']['content']!r}"
        )

        t0 = time.monotonic()
        resp = post(
            base + "/v1/chat/completions",
            {
                "model": MODEL_ID,
                "messages": MESSAGES,
                "max_tokens": 200,
                "seed": 2,
                "response_format": RESPONSE_FORMAT,
            },
        )
        c = resp["choices"][0]
        print(
            f"[openai] json_schema response: {time.monotonic() - t0:.2f} s, finish_reason={c['finish_reason']}, "
            f"completion_tokens={resp['usage']['completion_tokens']}"
        )
        print(f"[openai] JSON: {c['message']['content']}")
        obj = check_json(c["message"]["content"])
        if c["finish_reason"] != "stop":
            raise SystemExit(f"[openai] JSON output did not stop by itself: {c['finish_reason']}")
        print(f"[openai] schema-valid: {obj}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log:
            log.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["serve", "openai"], default="serve")
    ap.add_argument("--model-dir", help="tiny Qwen model dir (created there with make_tiny_qwen.py if missing)")
    ap.add_argument("--ray-temp-dir", default="/tmp/ray-llm-smoke", help="short path: Ray's socket paths must stay short")
    ap.add_argument("--port", type=int, default=0, help="openai mode: server port (default: a free one)")
    ap.add_argument("--timeout", type=float, default=300, help="openai mode: seconds to wait for /health")
    ap.add_argument("--log", help="openai mode: write the server's output to this file")
    ap.add_argument("--verbose", action="store_true", help="show Ray worker / vLLM server logs")
    args = ap.parse_args()

    os.environ.update(VLLM_ENV)
    t_start = time.monotonic()
    mem = PeakMemory()
    model_dir = ensure_model(args.model_dir)
    try:
        (run_serve if args.mode == "serve" else run_openai)(model_dir, args)
    finally:
        if not args.model_dir:  # a temporary one made here
            shutil.rmtree(model_dir, ignore_errors=True)
    print(f"[{args.mode}] {mem.report()}")
    print(f"[{args.mode}] OK in {time.monotonic() - t_start:.1f} s")


if __name__ == "__main__":
    main()
