#!/usr/bin/env bash
# Run the service on embedded defaults: real Redis, PostgreSQL and a Milvus server from wheels, API on :8000.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/memserve up "$@"
