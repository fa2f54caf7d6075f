"""Signal handlers that do their work on a thread of their own.

A Python signal handler runs in the main thread between two bytecodes.  One that takes a lock
(``threading.Event.set()``, ``queue.Queue.put()``) deadlocks when the signal lands while the
main thread holds that same lock, as it does for a moment inside ``Event.wait()``: a daemon
told to stop would wait for ever.  Here the handler only writes the signal's number to a
pipe; a thread reads it and calls the callback, where taking locks is safe.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Mapping


def relay_signals(callbacks: Mapping[int, Callable[[], None]]) -> None:
    """Call ``callbacks[signum]()`` on a relay thread whenever ``signum`` arrives, for the
    life of the process.  Call it from the main thread."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def on_signal(signum: int, frame: object) -> None:
        try:
            os.write(write_fd, bytes([signum]))
        except OSError:
            pass  # the pipe is full: the relay is far behind already, and this one is lost

    def relay() -> None:
        while True:
            for signum in os.read(read_fd, 64):
                callback = callbacks.get(signum)
                if callback is not None:
                    callback()

    for signum in callbacks:
        signal.signal(signum, on_signal)
    threading.Thread(target=relay, name="signals", daemon=True).start()
