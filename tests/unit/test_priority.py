"""lower_priority sets every thread of the process, and threads started later inherit it."""

import subprocess
import sys

SCRIPT = """
import os, threading, time
from serve_app.services.priority import lower_priority
stop = threading.Event()
before = threading.Thread(target=stop.wait); before.start()
changed = lower_priority(7)
after = threading.Thread(target=stop.wait); after.start()
time.sleep(0.1)
nices = {os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")}
stop.set()
print(changed, sorted(nices))
"""


def test_every_thread_and_later_ones_are_lowered():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True).stdout.split()
    assert int(out[0]) >= 2 and out[1:] == ["[7]"]


def test_zero_leaves_the_process_alone():
    from serve_app.services.priority import lower_priority

    assert lower_priority(0) == 0
