#!/usr/bin/env bash
# Create .venv and install the package with its test tools, the docs site's tools and the CPU build of torch.
# Idempotent: reinstalls only when pyproject.toml or the constraints change.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
stamp=.venv/.installed-$(cat pyproject.toml client/pyproject.toml constraints/cpu.txt | sha1sum | cut -c1-12)
if [[ ! -x .venv/bin/python ]]; then
  "$PYTHON" -m venv .venv
fi
if [[ ! -f $stamp ]]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  # constraints/cpu.txt pins the CPU torch wheel; a GPU image installs without it and keeps its own torch.
  # The typed client (client/, its own package) with its LangChain extra: the tests drive the service with it.
  .venv/bin/python -m pip install --quiet -c constraints/cpu.txt -e '.[cpu,test,bench,docs,otel]' -e './client[langchain]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi
