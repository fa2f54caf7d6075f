"""Holding GPU work to a duty from inside the job (standard library only, vendorable).

A job wraps each unit of GPU work in ``with duty.unit():``; a unit ends only once the GPU has
finished it (synchronise inside the block).  A unit that ran ``b`` seconds at duty ``d`` is
followed by the next no sooner than ``b/d`` after it began: ``b·(1−d)/d`` of idle when it ran
straight through, so the GPU is busy at most ``d`` of any second.  While idling, a newer
control document applies at once: a stop raises :class:`Stopped`, a pause waits, a new duty
changes the idle.  At duty 0 the next unit waits until the duty is above 0.

``b`` is the time the unit ran, which is what a reader of the job's busy time counts:

- ``device="cpu"``: the CPU time of the thread that ran it.  Time it waited for a CPU, or
  spent stopped (SIGSTOP, a frozen cgroup), is neither work nor owed idle.
- ``device="gpu"``: its wall time, less the time the process was stopped.  A stop is seen
  through ``SIGCONT`` (the handler is installed when the Duty is made on the main thread):
  a unit continued after a stop counts what ran after the continue plus at most one unit
  before it.  A stop nothing signals (a frozen cgroup) is bounded by ``max_unit_s``: no unit
  counts longer, so no idle is longer than ``max_unit_s·(1−d)/d``.  Keep units shorter
  (:meth:`Duty.scale` sizes them to the duty's share of a second).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .control import Control, Stopped, append_event

METRIC_EVERY_S = 2.0
_WAIT_SLICE_S = 0.25  # without a nudge, a newer control document is noticed this fast
#: the longest a unit timed by the wall clock counts (see the module's documentation)
MAX_UNIT_S = 2.0


class Duty:
    """The duty governor of one job (see the module's documentation).

    :param ctl: the job's :class:`Control`; without one the duty is 1 until :meth:`set`.
    :param events: where ``gpu_duty`` metric events go (default: the control's events path).
    :param device: ``"gpu"``, or ``"cpu"`` where the units run on a CPU (a stand-in).
    :param cpu_clock: with ``device="cpu"``, the clock a unit's run time is read from (the
        calling thread's CPU time).
    :param max_unit_s: the longest a unit timed by the wall clock counts.
    """

    def __init__(
        self,
        ctl: Control | None = None,
        events: str | None = None,
        device: str = "gpu",
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        cpu_clock: Callable[[], float] = time.thread_time,
        max_unit_s: float = MAX_UNIT_S,
    ) -> None:
        if device not in ("gpu", "cpu"):
            raise ValueError(f"device must be gpu or cpu, not {device!r}")
        if not max_unit_s > 0:
            raise ValueError(f"max_unit_s must be above 0, not {max_unit_s}")
        self.ctl = ctl
        self.events = events if events is not None else (ctl.events if ctl else None)
        self.device = device
        self._clock = clock
        self._sleep = sleep
        self._cpu_clock = cpu_clock
        self.max_unit_s = float(max_unit_s)
        self._continues = 0  # SIGCONTs seen, and when the last came (by ``clock``)
        self._continued_at = 0.0
        self._chained: Any = None
        self._installed = False
        if device == "gpu":
            self._watch_continues()
        self._duty = ctl.gpu_duty if ctl is not None else 1.0
        #: seconds spent idling for the duty (and paused): throughput reports leave it out
        self.idle_s = 0.0
        self.busy_s = 0.0
        self.units = 0
        self._last_unit_s: float | None = None
        self._overslept = 0.0  # idle beyond what was due, taken off the next idle
        self._window_start = clock()
        self._window_busy = 0.0
        self._window_waited = 0.0  # time inside units that did not run (the host's, not the job's)
        self._closed = False

    def _watch_continues(self) -> None:
        """Note each SIGCONT (a stop ended), passing it on to any handler installed before."""
        if not hasattr(signal, "SIGCONT") or threading.current_thread() is not threading.main_thread():
            return
        self._chained = signal.getsignal(signal.SIGCONT)
        signal.signal(signal.SIGCONT, self._on_continue)
        self._installed = True

    def _on_continue(self, signum: int, frame: Any) -> None:
        self.continued()
        if callable(self._chained):
            self._chained(signum, frame)

    def continued(self) -> None:
        """Say the process was just continued after a stop (the SIGCONT handler says so; call
        it where the Duty cannot see one: a job that handles ``SIGCONT`` itself, or a thaw)."""
        self._continued_at = self._clock()
        self._continues += 1

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
        continues = self._continues
        cpu_started = self._cpu_clock() if self.device == "cpu" else 0.0
        started = self._clock()
        yield
        ended = self._clock()
        busy = self._ran(ended - started, cpu_started, continues, ended)
        self.busy_s += busy
        self._window_busy += busy
        self._window_waited += max(0.0, ended - started - busy)
        self.units += 1
        self._last_unit_s = busy
        self._idle_after(busy, started, ended)
        self._maybe_report()

    def _ran(self, wall: float, cpu_started: float, continues: int, ended: float) -> float:
        """How long the unit that took ``wall`` seconds ran (see the module's documentation)."""
        if self.device == "cpu":
            return max(0.0, min(wall, self._cpu_clock() - cpu_started))
        if self._continues != continues:  # stopped during the unit: what ran after, and one unit before
            wall = min(wall, max(0.0, ended - self._continued_at) + (self._last_unit_s or 0.0))
        return max(0.0, min(wall, self.max_unit_s))

    def _idle_after(self, busy: float, started: float, ended: float) -> None:
        held = False  # paused (or at duty 0) during this idle
        while True:
            held = self._gate() or held
            # the next unit begins busy/d after this one began: what is left of that after it ended
            due = max(0.0, busy / self._duty - (ended - started))
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
            waited=round(self._window_waited / span, 4),
        )
        self._window_start, self._window_busy, self._window_waited = now, 0.0, 0.0

    def close(self) -> None:
        """Report the last window; no units after this."""
        if not self._closed:
            self._maybe_report(force=True)
            self._closed = True
            if self._installed and signal.getsignal(signal.SIGCONT) == self._on_continue:
                signal.signal(signal.SIGCONT, self._chained if self._chained is not None else signal.SIG_DFL)
            self._installed = False

    def __enter__(self) -> Duty:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
