"""A wake-up one thread rings and another waits on, both without holding the interpreter.

A thread that wakes another through a lock or a condition does it holding the interpreter's
lock: the woken thread, often put on the waker's core at once, finds that lock held and
sleeps again on it, and the waker, set aside while holding it, wakes a second time to let it
go.  A hand-over then cost about six context switches where three do.  A :class:`Bell` rings
by writing a byte to a pipe and waits by polling it, and the interpreter lets its lock go
around both system calls: the woken thread finds it free.
"""

from __future__ import annotations

import math
import os
import select
import weakref


def _close(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class Bell:
    """Rung by any thread, waited on by one.  Rings not yet waited for are kept (as one)."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._poll = select.poll()
        self._poll.register(self._read, select.POLLIN)
        # closed once no thread can ring or wait on it; not at the interpreter's exit, when a
        # daemon thread may still be waiting on it (the process's end closes it then)
        weakref.finalize(self, _close, self._read, self._write).atexit = False

    def ring(self) -> None:
        try:
            os.write(self._write, b"\0")
        except BlockingIOError:
            pass  # the pipe is full of rings not yet taken: the waiter wakes anyway

    def wait(self, timeout: float | None = None) -> bool:
        """Until rung, or ``timeout`` seconds (None: no end); whether it was rung.  Takes
        every ring so far."""
        ms = -1 if timeout is None else min(max(0, math.ceil(timeout * 1000)), 2**31 - 1)
        if not self._poll.poll(ms):
            return False
        try:
            while os.read(self._read, 4096):
                pass
        except BlockingIOError:
            pass
        return True
