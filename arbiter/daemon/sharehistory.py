"""Each tenant's measured GPU share and the jobs' total over the last minutes, one point per
tick, for the status page's chart.

The decision thread alone adds to a :class:`ShareHistory` (one point per ``Tick`` it takes)
and hands the frozen points to every snapshot it publishes; readers see a tuple that never
changes under them.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from arbiter.daemon.observe import TickView

WINDOW_S = 600.0
#: however short the tick, the history holds no more points than this (a tick of 0.05 s
#: would otherwise keep 12 000)
MAX_POINTS = 3000


@dataclass(frozen=True)
class SharePoint:
    """What one tick measured.

    ``tenants``: rule id → its programs' GPU share (0 when none runs, None when it could not
    be read).  ``jobs``: the fleet jobs' summed measured share over their last compliance
    sample, None when one job's could not be read."""

    t: float  # wall clock, seconds
    tenants: Mapping[str, float | None]
    jobs: float | None


def point_of(view: TickView, wall: float) -> SharePoint:
    tenants = {rid: obs.gpu_share for rid, obs in view.rules.items()}
    busy = [view.job_busy[jid] for jid in view.job_processes if jid in view.job_busy]
    jobs = None if any(b is None for b in busy) else sum(b for b in busy if b is not None)
    return SharePoint(wall, tenants, jobs)


def capacity(tick_s: float, window_s: float = WINDOW_S) -> int:
    """How many points cover ``window_s`` at one a tick (at least one, at most MAX_POINTS)."""
    return max(1, min(MAX_POINTS, math.ceil(window_s / max(tick_s, 1e-3))))


class ShareHistory:
    """A bounded, oldest-first record of :class:`SharePoint`; written by one thread."""

    def __init__(self, tick_s: float, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._points: deque[SharePoint] = deque(maxlen=capacity(tick_s, window_s))
        self._frozen: tuple[SharePoint, ...] = ()

    def add(self, view: TickView, wall: float) -> None:
        self._points.append(point_of(view, wall))
        self._frozen = tuple(self._points)

    def points(self) -> tuple[SharePoint, ...]:
        """The points, oldest first, as of the last :meth:`add` (the same tuple until the next)."""
        return self._frozen


#: the status answer carries at most this many columns: each the mean of the ticks it covers
COLUMNS = 120


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known) / len(known), 4) if known else None


def share_view(
    points: Sequence[SharePoint],
    window_s: float = WINDOW_S,
    columns: int = COLUMNS,
    loaded: Collection[str] | None = None,
) -> dict[str, Any]:
    """The history as columns: ``t``, each tenant's shares and the jobs' total, aligned; a
    tenant not loaded at a point reads null there, as one that could not be read, and one
    not among ``loaded`` now (its rule file removed) is left out.  Past ``columns`` points,
    each column is the mean of consecutive ticks (its ``t`` the last of them), so every
    status answer stays small whatever the tick."""
    names = sorted({rid for p in points for rid in p.tenants if loaded is None or rid in loaded})
    size = max(1, math.ceil(len(points) / columns))
    groups = [points[i : i + size] for i in range(0, len(points), size)]
    return {
        "window_s": window_s,
        "t": [round(g[-1].t, 2) for g in groups],
        "tenants": {rid: [_mean([p.tenants.get(rid) for p in g]) for g in groups] for rid in names},
        "jobs": [_mean([p.jobs for p in g]) for g in groups],
    }
