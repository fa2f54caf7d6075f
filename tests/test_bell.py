"""The bell one thread rings and another waits on: a ring wakes the waiter, rings not yet
waited for are kept as one, and a wait without a ring ends at its timeout."""

from __future__ import annotations

import threading

from arbiter.runtime.bell import Bell


def test_a_ring_wakes_the_waiter_and_rings_before_a_wait_are_kept_as_one() -> None:
    bell = Bell()
    assert bell.wait(0) is False
    bell.ring()
    bell.ring()
    assert bell.wait(0) is True  # both taken at once
    assert bell.wait(0.01) is False
    woke = threading.Event()

    def waiter() -> None:
        if bell.wait(30):
            woke.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    bell.ring()
    thread.join(30)
    assert woke.is_set()


def test_a_bell_rung_more_than_its_pipe_holds_still_rings() -> None:
    bell = Bell()
    for _ in range(200_000):  # past what the pipe holds: the ring is there already
        bell.ring()
    assert bell.wait(0) is True
    assert bell.wait(0) is False
