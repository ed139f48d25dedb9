#!/usr/bin/env bash
# Debian's chromium and its version-matched chromium-driver, for the inspector's browser tests
# (Selenium; Playwright cannot download its own browsers here). Needs root, as CI has.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  exit 0
fi
if [[ $(id -u) != 0 ]]; then
  echo "error: the inspector's browser tests need chromium and chromium-driver: run 'apt-get install chromium chromium-driver' as root" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null \
  || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null; }
