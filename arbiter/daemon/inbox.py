"""What the daemon's threads hand each other: one dataclass per kind of message.

The decision thread's inbox takes :data:`Message`; the fast path's queue takes :data:`Report`
(what a source, a session helper or the reflex process said, to be taken in the order each
origin said it).  Both end with :class:`Stop`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from arbiter.daemon.observe import TickView
from arbiter.daemon.sources import HelperKey, SlotKey
from arbiter.engine.types import CertView, Policy, Release
from arbiter.plugin import SourceState


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


@dataclass(frozen=True)
class Sourced:
    """These rules' sources changed (the fast path took the reports already)."""

    rules: frozenset[str]


Message = Stop | Tick | PolicyChanged | ReleaseOver | ChangeRun | JobEnded | JobsChanged | Sourced


# --- for the fast path ---------------------------------------------------------------------------


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


Report = Stop | SourceReport | HelperReport | HelperGone | LinkLines


def origin(report: Report) -> Hashable:
    """Whose report it is: a source's slot, or a session helper (its reports and its going
    away are one sequence); only an origin's own older reports hold a report back."""
    if isinstance(report, SourceReport):
        return report.key
    if isinstance(report, HelperReport | HelperGone):
        return report.helper
    return type(report).__name__
