#!/usr/bin/env bash
# Run every test: lint, pure units, store contracts and Serve end to end (starts its own servers).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export HF_HUB_OFFLINE=1
.venv/bin/ruff check .
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
