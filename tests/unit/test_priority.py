"""lower_priority lowers every thread of the process relative to where it was, and threads started later inherit it."""

import os
import subprocess
import sys

SCRIPT = """
import os, threading, time
from serve_app.runtime.priority import lower_priority
stop = threading.Event()
before = threading.Thread(target=stop.wait); before.start()
changed = lower_priority(7)
after = threading.Thread(target=stop.wait); after.start()
time.sleep(0.1)
nices = {os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")}
stop.set()
print(changed, sorted(nices))
"""


def _run_at(start: int) -> list[str]:
    def start_nice() -> None:
        os.setpriority(os.PRIO_PROCESS, 0, start)

    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, preexec_fn=start_nice)
    return done.stdout.split()


def test_every_thread_and_later_ones_are_lowered():
    out = _run_at(0)
    assert int(out[0]) >= 2 and out[1:] == ["[7]"]


def test_lowered_relative_to_where_ray_started_the_worker():
    assert _run_at(5)[1:] == ["[12]"]  # Ray's default worker niceness is 15: 15 + 7 caps at 19
    assert _run_at(15)[1:] == ["[19]"]


ZERO = """
import os, threading
from serve_app.runtime.priority import lower_priority
stop = threading.Event()
worker = threading.Thread(target=stop.wait); worker.start()
changed = lower_priority(0)
nices = {os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")}
stop.set()
print(changed, sorted(nices))
"""


def test_zero_leaves_every_thread_where_it_was():
    def start_nice() -> None:
        os.setpriority(os.PRIO_PROCESS, 0, 3)

    done = subprocess.run([sys.executable, "-c", ZERO], capture_output=True, text=True, check=True, preexec_fn=start_nice)
    assert done.stdout.split() == ["0", "[3]"]
