"""Where this machine keeps what is built or unpacked once and reused by every process."""

from __future__ import annotations

import os
from pathlib import Path


def cache_base() -> Path:
    """`MEMSERVE_CACHE_DIR`, else the user's cache directory (what is kept there is machine-specific)."""
    configured = os.environ.get("MEMSERVE_CACHE_DIR")
    return Path(configured) if configured else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "memserve"
