"""Holding GPU work to a duty from inside the job (standard library only, vendorable).

A job wraps each unit of GPU work in ``with duty.unit():``; a unit ends only once the GPU has
finished it (synchronise inside the block).  After a unit of ``b`` seconds at duty ``d`` the
job idles ``b·(1−d)/d``, so the GPU is busy at most ``d`` of any second.  While idling, a
newer control document applies at once: a stop raises :class:`Stopped`, a pause waits, a new
duty changes the idle.  At duty 0 the next unit waits until the duty is above 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .control import Control, Stopped, append_event

METRIC_EVERY_S = 2.0
_WAIT_SLICE_S = 0.25  # without a nudge, a newer control document is noticed this fast


class Duty:
    """The duty governor of one job (see the module's documentation).

    :param ctl: the job's :class:`Control`; without one the duty is 1 until :meth:`set`.
    :param events: where ``gpu_duty`` metric events go (default: the control's events path).
    :param device: ``"gpu"``, or ``"cpu"`` where the units run on a CPU (a stand-in).
    """

    def __init__(
        self,
        ctl: Control | None = None,
        events: str | None = None,
        device: str = "gpu",
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if device not in ("gpu", "cpu"):
            raise ValueError(f"device must be gpu or cpu, not {device!r}")
        self.ctl = ctl
        self.events = events if events is not None else (ctl.events if ctl else None)
        self.device = device
        self._clock = clock
        self._sleep = sleep
        self._duty = ctl.gpu_duty if ctl is not None else 1.0
        #: seconds spent idling for the duty (and paused): throughput reports leave it out
        self.idle_s = 0.0
        self.busy_s = 0.0
        self.units = 0
        self._last_unit_s: float | None = None
        self._overslept = 0.0  # idle beyond what was due, taken off the next idle
        self._window_start = clock()
        self._window_busy = 0.0
        self._closed = False

    # --- the duty -------------------------------------------------------------------------

    @property
    def duty(self) -> float:
        return self._duty

    def set(self, duty: float) -> None:
        """Set the duty by hand (for use without a control document)."""
        if not 0.0 <= duty <= 1.0:
            raise ValueError(f"a duty is between 0 and 1, not {duty}")
        self._duty = float(duty)

    def _take_control(self) -> None:
        """Apply the control document: a stop raises, a new duty is taken."""
        if self.ctl is None:
            return
        self.ctl.refresh()
        if self.ctl.state == "stop":
            raise Stopped(self.ctl.reason or "stopped by arbiter")
        self._duty = self.ctl.gpu_duty

    def _wait(self, seconds: float) -> None:
        """Idle up to ``seconds``, waking early when the control document changes."""
        started = self._clock()
        if self.ctl is not None:
            self.ctl.wait(seconds)
        else:
            self._sleep(seconds)
        self.idle_s += self._clock() - started

    def _gate(self) -> bool:
        """Wait while paused or at duty 0; raise on stop.  True when it had to wait."""
        waited = False
        while True:
            self._take_control()
            paused = self.ctl is not None and self.ctl.state == "paused"
            if not paused and self._duty > 0:
                return waited
            if self.ctl is None:
                raise RuntimeError("duty 0 without a control document would wait for ever; set() a duty above 0")
            self._wait(_WAIT_SLICE_S)
            waited = True

    def scale(self) -> float:
        """The size of the next unit relative to the last one for it to fit the duty's share
        of a second (below 1: make it smaller; above 1: it may grow); 1 until a unit has run.
        Multiply the last unit's size by it, and keep the result within the job's own limits."""
        if not self._last_unit_s or self._duty <= 0:
            return 1.0
        return self._duty / self._last_unit_s

    # --- units ----------------------------------------------------------------------------

    @contextmanager
    def unit(self) -> Iterator[None]:
        """One unit of GPU work; idles for the duty after it."""
        if self._closed:
            raise RuntimeError("this Duty was closed")
        if self._gate():
            self._overslept = 0.0
        started = self._clock()
        yield
        ended = self._clock()
        busy = ended - started
        self.busy_s += busy
        self._window_busy += busy
        self.units += 1
        self._last_unit_s = busy
        self._idle_after(busy, ended)
        self._maybe_report()

    def _idle_after(self, busy: float, ended: float) -> None:
        held = False  # paused (or at duty 0) during this idle
        while True:
            held = self._gate() or held
            due = busy * (1.0 - self._duty) / self._duty
            credit = 0.0 if held else min(self._overslept, due)
            left = ended + due - credit - self._clock()
            if left <= 0:
                # a sleep's overshoot is given back on the next idle, at most one idle's worth;
                # time spent paused is not idle owed back (units must not run back to back)
                self._overslept = 0.0 if held else min(due, self._overslept - credit + max(0.0, -left))
                return
            duty_before = self._duty
            self._wait(min(left, _WAIT_SLICE_S) if self.ctl is not None else left)
            if self._duty != duty_before:
                self._overslept = 0.0  # a new duty starts its own account

    # --- reports --------------------------------------------------------------------------

    def _maybe_report(self, force: bool = False) -> None:
        now = self._clock()
        span = now - self._window_start
        if not self.events or (span < METRIC_EVERY_S and not force) or span <= 0:
            return
        append_event(
            self.events,
            "metric",
            name="gpu_duty",
            busy=round(self._window_busy / span, 4),
            duty=self._duty,
            device=self.device,
        )
        self._window_start, self._window_busy = now, 0.0

    def close(self) -> None:
        """Report the last window; no units after this."""
        if not self._closed:
            self._maybe_report(force=True)
            self._closed = True

    def __enter__(self) -> Duty:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
