"""Signal handlers that do their work on a thread of their own.

A Python signal handler runs in the main thread between two bytecodes.  One that takes a lock
(``threading.Event.set()``, ``queue.Queue.put()``) deadlocks when the signal lands while the
main thread holds that same lock, as it does for a moment inside ``Event.wait()``: a daemon
told to stop would wait for ever.  And the kernel may hand a signal sent to the process to any
of its threads: one taken by another thread while the main thread waits on a lock without a
timeout leaves the Python handler unrun until the main thread wakes, which may be never.  So
the interpreter's own low-level handler, which runs on whichever thread the kernel picked,
writes the signal's number to a pipe (its wake-up descriptor); a thread reads it and calls
the callback, where taking locks is safe.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)


def relay_signals(callbacks: Mapping[int, Callable[[], None]]) -> None:
    """Call ``callbacks[signum]()`` on a relay thread whenever ``signum`` arrives, for the
    life of the process.  Call it from the main thread."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def relay() -> None:
        while True:
            for signum in os.read(read_fd, 64):
                callback = callbacks.get(signum)
                if callback is None:
                    continue
                try:
                    callback()
                except Exception:  # the relay must outlive a callback: it carries every later signal
                    log.exception("handling signal %d failed", signum)

    # a full pipe drops the number: the relay is far behind already
    if signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False) != -1:
        raise RuntimeError("signals are relayed already in this process")
    for signum in callbacks:
        signal.signal(signum, _written_already)
    threading.Thread(target=relay, name="signals", daemon=True).start()


def _written_already(signum: int, frame: object) -> None:
    """The Python-level handler: the wake-up descriptor carried the signal to the relay, and
    a handler must be set for the interpreter to catch the signal at all."""
