"""`memserve up` stops on SIGTERM wherever the signal lands, library code included."""

import inspect
import os
import signal
import threading

import pytest

from serve_app.cli import _stop_handler, _StopRequested


def test_a_stop_signal_is_not_swallowed_by_library_code_that_catches_exceptions():
    """The signal lands in whatever runs on the main thread: during a deploy that is Ray's code,
    which (like `inspect.getfullargspec`, called when Ray makes an actor) turns any `Exception`
    into an error of its own. The stop must get through such code unchanged."""
    stop = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGTERM, _stop_handler(stop))

    class SignalledWhileInspected:
        @property
        def __signature__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1_000_000):  # the handler runs between two bytecodes of this loop
                pass
            return None

        def __call__(self):
            pass

    try:
        with pytest.raises(_StopRequested):
            inspect.getfullargspec(SignalledWhileInspected())
        assert stop.is_set()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
