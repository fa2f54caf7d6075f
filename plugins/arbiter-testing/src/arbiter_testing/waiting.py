"""Waiting on a condition with a deadline: the one way tests and fakes wait.

A test never sleeps a fixed time and then asserts: on a busy two-core machine the fixed
time is too short one run in fifty, and on an idle one it wastes the rest.  It polls the
condition instead, and fails with what it was waiting for and what it last saw.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T | None],
    timeout_s: float = 10.0,
    what: str = "",
    poll_s: float = 0.01,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    :param timeout_s: how long to wait before failing
    :param what: what is awaited, for the failure's message (the predicate's name if empty)
    :param poll_s: the pause between two polls
    :param ignore: exceptions that count as "not yet" (a daemon still starting, say)
    :raises AssertionError: after ``timeout_s``, naming ``what`` and the last value seen
    """
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            last = predicate()
        except ignore as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            name = what or getattr(predicate, "__name__", "a condition")
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {name} (last: {last!r})")
        time.sleep(poll_s)
