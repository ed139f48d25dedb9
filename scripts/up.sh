#!/usr/bin/env bash
# Run the service on embedded defaults: real Redis, PostgreSQL and Milvus Lite from wheels, API on :8000.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/memserve up "$@"
