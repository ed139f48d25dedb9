"""The tiny random-weight Qwen2 of the LLM tests, built once per machine and kept in its cache.

scripts/make_tiny_qwen.py writes the same model every time (fixed seed, the same tokenizer files),
so a build is kept under the digest of the script: a changed script builds a new one. Building
costs a quarter to a whole minute on two cores, and the main run (the reliability suite) and the
tests/llm run each need the model.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

from bench.vllm_server import make_tiny_model
from serve_app.runtime.cache import cache_base

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "make_tiny_qwen.py"


def tiny_model_dir() -> Path:
    """The directory of the built model; built here first if this machine has none for this script."""
    target = cache_base() / "tiny-qwen" / hashlib.sha256(SCRIPT.read_bytes()).hexdigest()[:16]
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    try:
        make_tiny_model(building)
        building.rename(target)  # whole or not at all: a reader never sees a half-written model
    except OSError:
        if not (target / "config.json").exists():  # not a build that another process finished first
            raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return target
