"""One window of a paired run as it goes, pure: what the run sees on a decision
(:class:`RunObs`), the window in progress (:class:`Window`), what it notes while it runs
(:func:`watch`) and what it read once it ends (:func:`measured`).

The first ``washout_s`` of a window is discarded; its rate is events / seconds over the
measured part, both read at the decisions that bound it.  Anything outside the fleet that
changes against the block's reference (its first window's phases, processes and power)
spoils the window.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from arbiter.engine.abplan import Arm, WindowReading


@dataclass(frozen=True)
class RunObs:
    """What the run sees on one decision."""

    now: float  # monotonic
    wall: float
    count: int | None  # the protected program's progress events so far (None: unreadable)
    count_why: str = ""  # why it cannot be read
    running: bool = True
    pids: frozenset[int] = frozenset()
    phases: tuple[str, ...] = ()
    power: str | None = None
    memory_guard: bool = False
    work_running: bool = False  # some of the work runs now
    work_duty: float | None = None  # the work's mean measured duty over its last sample
    work_sample_at: float | None = None  # when that sample was taken (None: none new)


@dataclass(frozen=True)
class Window:
    """The window in progress (never persisted: a restart discards it)."""

    attempt: int  # the block number it belongs to
    arm: Arm
    second: bool  # the block's second window
    opened_at: float
    measure_from: float
    ends_at: float
    count0: int | None = None  # at the measured part's start
    t0: float | None = None
    wall0: float | None = None
    phases: tuple[str, ...] = ()
    pids: frozenset[int] = frozenset()
    power: str | None = None
    duty_sum: float = 0.0
    duty_n: int = 0
    duty_unread: bool = False
    last_sample: float | None = None
    work_ran: bool = False
    spoiled: str = ""  # the first thing seen that leaves it out
    has_ref: bool = False  # phases, pids and power hold the block's reference (taken in its first window)
    phase_changed: bool = False
    restarted: bool = False
    power_changed: bool = False
    memory_guard: bool = False

    @property
    def disturbed(self) -> bool:
        """Something outside the fleet changed: the window is left out, never judged."""
        return bool(self.spoiled) or self.restarted or self.phase_changed or self.power_changed or self.memory_guard


def _changes(w: Window, sees: RunObs) -> Window:
    """What differs from the block's reference (watched in the washout too, once there is one)."""
    return replace(
        w,
        restarted=w.restarted or not sees.running or (bool(w.pids) and not (w.pids & sees.pids)),
        phase_changed=w.phase_changed or sees.phases != w.phases,
        power_changed=w.power_changed or sees.power != w.power,
        memory_guard=w.memory_guard or sees.memory_guard,
    )


def watch(w: Window, sees: RunObs) -> Window:
    """Note what happens during the window; progress counts only over its measured part."""
    if sees.now < w.measure_from:
        return _changes(w, sees) if w.has_ref else w
    unreadable = sees.count_why or "its progress source cannot be read"
    if w.t0 is None:  # the measured part begins
        if sees.count is None:
            return replace(w, spoiled=w.spoiled or unreadable)
        if not w.has_ref:  # the block's first window: its reference starts here
            w = replace(w, phases=sees.phases, pids=sees.pids, power=sees.power, has_ref=True)
        w = replace(w, count0=sees.count, t0=sees.now, wall0=sees.wall, work_ran=sees.work_running)
        return _changes(w, sees)
    spoiled = w.spoiled
    if sees.count is None:
        spoiled = spoiled or unreadable
    elif w.count0 is not None and sees.count < w.count0:
        spoiled = spoiled or "its progress count went back (the source restarted)"
    t0 = w.t0
    w = replace(_changes(w, sees), spoiled=spoiled, work_ran=w.work_ran or sees.work_running)
    if (
        w.arm == "on"
        and sees.work_sample_at is not None
        and sees.work_sample_at != w.last_sample
        and sees.work_sample_at >= t0
    ):
        if sees.work_duty is None:
            w = replace(w, duty_unread=True, last_sample=sees.work_sample_at)
        else:
            w = replace(w, duty_sum=w.duty_sum + sees.work_duty, duty_n=w.duty_n + 1, last_sample=sees.work_sample_at)
    return w


def measured(w: Window, sees: RunObs) -> WindowReading:
    if w.t0 is None or w.count0 is None or w.wall0 is None:
        return WindowReading(0, 0.0, unreadable=w.spoiled or "its measured part was never read")
    seconds = sees.now - w.t0
    events = (sees.count or 0) - w.count0
    duty = None if w.duty_unread or not w.duty_n else w.duty_sum / w.duty_n
    return WindowReading(
        events=max(0, events),
        seconds=seconds,
        phase_changed=w.phase_changed,
        program_restarted=w.restarted,
        wall_minus_monotonic_s=(sees.wall - w.wall0) - seconds,
        power_changed=w.power_changed,
        memory_guard=w.memory_guard,
        work_duty=duty,
        work_ran=w.work_ran,
        unreadable=w.spoiled,
    )
