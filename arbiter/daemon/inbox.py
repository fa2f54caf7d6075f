"""What the daemon's threads hand the decision thread: one dataclass per kind of message.

Its inbox takes :data:`Message`: ticks, changes of policy, jobs and paired runs, and every
:data:`Report` (what a source, a session helper or the reflex process said), in the order
they came; it ends with :class:`Stop`.
"""

from __future__ import annotations

import queue
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from arbiter.daemon.observe import TickView
from arbiter.daemon.sources import HelperKey, SlotKey
from arbiter.engine.types import CertView, Policy, Release
from arbiter.plugin import SourceState
from arbiter.runtime.bell import Bell


@dataclass(frozen=True)
class Stop:
    """The daemon is stopping: the thread that takes this returns."""


# --- for the decision thread -------------------------------------------------------------------


@dataclass(frozen=True)
class Tick:
    """A fresh view of the machine and every source's reading on the tick."""

    view: TickView
    wanted: dict[SlotKey, tuple[str, int]]  # each source slot's kind and rule serial
    readings: dict[SlotKey, SourceState]
    certificates: tuple[CertView, ...]


@dataclass(frozen=True)
class PolicyChanged:
    policy: Policy


@dataclass(frozen=True)
class ReleaseOver:
    """No VRAM is coming back from ``release``: it failed, or it asked nothing of anyone."""

    release: Release
    failed: bool


#: ``change(current run) -> (new run, answer)``, run on the decision thread, which owns the
#: engine state
RunChange = Callable[[Any], tuple[Any, Any]]


@dataclass(frozen=True)
class ChangeRun:
    """Start or abort a paired run; the asker waits on ``answer`` (and may cancel it first)."""

    change: RunChange
    answer: Future[Any]


@dataclass(frozen=True)
class JobEnded:
    job_id: str


@dataclass(frozen=True)
class JobsChanged:
    """The job registry changed: decide now rather than at the next tick."""


# --- reports ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceReport:
    """A source's report, from its own thread."""

    key: SlotKey
    state: SourceState


@dataclass(frozen=True)
class HelperReport:
    """A session helper's reading of a source, from a socket thread."""

    helper: HelperKey
    key: SlotKey
    state: SourceState


@dataclass(frozen=True)
class HelperGone:
    helper: HelperKey


@dataclass(frozen=True)
class LinkLines:
    """The reflex process wrote lines: take them, in order."""


Report = SourceReport | HelperReport | HelperGone | LinkLines
Message = Stop | Tick | PolicyChanged | ReleaseOver | ChangeRun | JobEnded | JobsChanged | Report

T = TypeVar("T")


class Inbox(Generic[T]):
    """Put by any thread, taken by one; a put rings the taker's bell (see
    :mod:`arbiter.runtime.bell`): a thread that hands the decision thread a tick, say, does
    not leave it waiting for the interpreter the moment it wakes."""

    def __init__(self) -> None:
        self._items: deque[T] = deque()  # appends and pops are atomic
        self._bell = Bell()

    def put(self, item: T) -> None:
        self._items.append(item)
        self._bell.ring()

    def get(self) -> T:
        """The oldest item, waiting for one."""
        while True:
            try:
                return self._items.popleft()
            except IndexError:
                self._bell.wait()

    def get_nowait(self) -> T:
        try:
            return self._items.popleft()
        except IndexError:
            raise queue.Empty from None

    def empty(self) -> bool:
        return not self._items


def drained(inbox: Inbox[T]) -> list[T] | None:
    """Everything waiting (at least one item), or None once a stop is among it."""
    batch = [inbox.get()]
    while True:
        try:
            batch.append(inbox.get_nowait())
        except queue.Empty:
            break
    return None if any(isinstance(item, Stop) for item in batch) else batch
