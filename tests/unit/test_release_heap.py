"""release_freed_heap returns freed heap pages to the OS (what keeps the Embedder's PSS flat)."""

import os
import subprocess
import sys

import pytest

SCRIPT = """
import psutil
from serve_app.encoding.sentence import release_freed_heap
me = psutil.Process()
chunks = [bytearray(64 * 1024) for _ in range(3000)]  # ~190 MiB from the heap (below the mmap threshold)
pin = bytearray(64 * 1024)  # allocated last: the heap's top stays in use, so free() cannot shrink it
del chunks
before = me.memory_info().rss
release_freed_heap()
after = me.memory_info().rss
print(before // 2**20, after // 2**20)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc_trim")
def test_freed_heap_pages_go_back_to_the_os():
    env = {**os.environ, "MALLOC_ARENA_MAX": "1"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, env=env).stdout
    before, after = map(int, out.split())
    assert before - after > 150, (before, after)
