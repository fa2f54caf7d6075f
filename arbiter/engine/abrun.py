"""A paired ON/OFF run as it goes, pure.

:func:`advance` takes the run's state and what one decision sees (the protected program's
progress count, its processes and phases, the power source, the memory guard, the work's
measured duty, both clocks) and returns the new state: which arm holds now, the windows and
blocks done, the blocks left out and why, and, at the end, the verdict.  The decision uses
the arm to run or hold the work under test (:func:`covers`); the daemon persists the run
and issues the certificate a passing run earns.

- Windows open when the previous one closes; the first ``washout_s`` of each is discarded;
  rate = events / seconds over the measured part, both read at the decisions that bound it.
- A window spoiled by something outside the fleet (:func:`arbiter.engine.abplan.exclusion`)
  leaves its whole block out; the block is repeated under the next block number.
- A collapse of progress in an ON window (under half the last OFF rate) ends the run as a
  slowdown, at once, not at the window's end.
- After the pilot (the first ``pilot`` blocks) the run is sized with the upper 80 %
  confidence limit of the SD; one that cannot reach the margin within ``max_hours`` is
  refused.  The pilot is then left out of R and its interval (:mod:`arbiter.engine.abstats`).  A run that outlives ``max_hours`` or leaves out too many blocks is aborted.
- A sweep is a run per level; a run that passes starts the next level, the first that does
  not ends the sweep.

It runs past 500 lines because a window's life (open, watch, read, finish, leave out,
close) is one state machine over one run state; planning and statistics are
:mod:`arbiter.engine.abplan` and :mod:`arbiter.engine.abstats`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from arbiter.engine import codes
from arbiter.engine.abplan import (
    WORK_GONE,
    Arm,
    WindowReading,
    collapsed,
    exclusion,
    exclusions_mostly_on,
    order,
)
from arbiter.engine.abstats import Analysis, Block, analyse, blocks_needed, blocks_within, planned_hours
from arbiter.engine.values import JobObs, TimelineEvent

RunStatus = Literal["running", "done", "aborted", "refused"]
OffMode = Literal["paused", "evicted"]
#: a run that leaves out more than this many blocks per planned block is aborted
MAX_EXCLUDED_PER_BLOCK = 2
DEFAULT_LEVELS = (0.1, 0.2, 0.35, 0.5, 0.65, 0.8, 1.0)


def covers(work: str, job: JobObs) -> bool:
    """Whether ``--work`` names this job: ``gpu`` every GPU job, ``cpu`` every other, ``all``
    both, else the job's name."""
    if work == "gpu":
        return job.uses_gpu
    if work == "cpu":
        return not job.uses_gpu
    return work == "all" or work == job.name


@dataclass(frozen=True)
class RunSpec:
    run_id: str
    rule_id: str
    work: str = "gpu"
    duty: float | None = None  # the duty cooperative work holds in ON windows (None: as it runs)
    blocks: int = 12
    window_s: float = 300.0
    washout_s: float = 60.0
    margin: float = 0.02
    off: OffMode = "paused"
    max_hours: float = 8.0
    seed: str = ""
    pilot: int = 4
    sweep_id: str | None = None
    levels: tuple[float, ...] = ()  # a sweep's levels still to run after this one

    def planned_hours(self, blocks: int | None = None) -> float:
        return planned_hours(blocks or self.blocks, self.window_s)


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


@dataclass(frozen=True)
class BlockDone:
    attempt: int
    on_first: bool
    on_events: int
    on_s: float
    off_events: int
    off_s: float
    work_duty: float | None
    at: float  # wall clock

    @property
    def on(self) -> float:
        return self.on_events / self.on_s

    @property
    def off(self) -> float:
        return self.off_events / self.off_s


@dataclass(frozen=True)
class Excluded:
    attempt: int
    arm: Arm
    why: str
    at: float  # wall clock


@dataclass(frozen=True)
class RunState:
    spec: RunSpec
    started_wall: float
    status: RunStatus = "running"
    target: int = 0  # blocks planned (raised after the pilot)
    attempt: int = 0  # the block number now
    window: Window | None = None
    first: tuple[Arm, WindowReading] | None = None  # the block's first window, done
    #: what the block's second window is compared with: (phases, pids, power) of its first
    ref: tuple[tuple[str, ...], frozenset[int], str | None] | None = None
    blocks: tuple[BlockDone, ...] = ()
    excluded: tuple[Excluded, ...] = ()
    verdict: str = ""  # when ended: the analysis's verdict, "slowdown" (collapse), "refused", "aborted"
    certifies: bool = False
    why: str = ""
    ended_wall: float | None = None
    passed: tuple[float, ...] = ()  # a sweep: the levels passed before this run

    @property
    def running(self) -> bool:
        return self.status == "running"

    def durable(self) -> tuple[Any, ...]:
        """What a restart keeps: it changes only when a block ends or the run does."""
        return (self.status, self.target, self.attempt, self.blocks, self.excluded, self.verdict, self.spec)


def start(spec: RunSpec, wall: float, passed: tuple[float, ...] = ()) -> RunState:
    return RunState(spec=spec, started_wall=wall, target=max(spec.blocks, pilot_of(spec) + 2), passed=passed)


def pilot_of(spec: RunSpec) -> int:
    """The blocks that size the run and are left out of R (a pilot under 2 blocks sizes nothing)."""
    return spec.pilot if spec.pilot >= 2 else 0


def analysis(rs: RunState) -> Analysis | None:
    """The run's statistics so far; None until two blocks after the pilot are done."""
    pilot = pilot_of(rs.spec)
    if len(rs.blocks) < pilot + 2:
        return None
    return analyse([Block(b.on, b.off, b.on_first) for b in rs.blocks], rs.spec.margin, pilot)


def abort(rs: RunState, why: str, wall: float) -> RunState:
    """Ended by its owner: no certificate, and a sweep goes no further."""
    return _end(replace(rs, spec=replace(rs.spec, levels=())), "aborted", "aborted", why, wall)


@dataclass(frozen=True)
class Advance:
    state: RunState | None
    events: tuple[TimelineEvent, ...]
    ended: tuple[RunState, ...] = ()  # runs that ended on this step (a sweep may start the next)


def _event(code: str, rs: RunState, message: str, **data: Any) -> TimelineEvent:
    return TimelineEvent(code, rs.spec.rule_id, message, {"run": rs.spec.run_id, "rule": rs.spec.rule_id, **data})


def _open(rs: RunState, sees: RunObs) -> Window:
    spec = rs.spec
    arms = order(spec.seed, rs.attempt)
    second = rs.first is not None
    w = Window(
        rs.attempt,
        arms[1] if second else arms[0],
        second,
        sees.now,
        sees.now + spec.washout_s,
        sees.now + spec.window_s,
    )
    if second and rs.ref is not None:  # both windows of a block are judged against one reference
        phases, pids, power = rs.ref
        w = replace(w, phases=phases, pids=pids, power=power, has_ref=True)
    return w


def _changes(w: Window, sees: RunObs) -> Window:
    """What differs from the block's reference (watched in the washout too, once there is one)."""
    return replace(
        w,
        restarted=w.restarted or not sees.running or (bool(w.pids) and not (w.pids & sees.pids)),
        phase_changed=w.phase_changed or sees.phases != w.phases,
        power_changed=w.power_changed or sees.power != w.power,
        memory_guard=w.memory_guard or sees.memory_guard,
    )


def _watch(w: Window, sees: RunObs) -> Window:
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


def _reading(w: Window, sees: RunObs) -> WindowReading:
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


def _last_off_rate(rs: RunState) -> float | None:
    if rs.first is not None and rs.first[0] == "off":
        return rs.first[1].rate
    return rs.blocks[-1].off if rs.blocks else None


def _end(rs: RunState, status: RunStatus, verdict: str, why: str, wall: float, certifies: bool = False) -> RunState:
    return replace(
        rs,
        status=status,
        verdict=verdict,
        why=why,
        certifies=certifies,
        window=None,
        first=None,
        ref=None,
        ended_wall=wall,
    )


def _next_in_sweep(rs: RunState, wall: float) -> RunState | None:
    spec = rs.spec
    if not rs.certifies or not spec.levels or spec.sweep_id is None:
        return None
    index = int(spec.run_id.rsplit("-", 1)[1]) + 1
    run_id = f"{spec.sweep_id}-{index}"
    nxt = replace(spec, run_id=run_id, duty=spec.levels[0], levels=spec.levels[1:], seed=run_id)
    passed = rs.passed if spec.duty is None else (*rs.passed, spec.duty)
    return start(nxt, wall, passed=passed)


def _finish(rs: RunState, sees: RunObs, events: list[TimelineEvent]) -> RunState:
    """The block just completed may end the run: after the pilot, or at its target."""
    spec = rs.spec
    n = len(rs.blocks)
    if n == pilot_of(spec) and n >= 2:
        most = blocks_within(spec.max_hours, spec.window_s) - n  # the blocks its hours leave
        needed = blocks_needed([Block(b.on, b.off, b.on_first) for b in rs.blocks], spec.margin, max(0, most))
        if needed is None:
            return _end(
                rs,
                "refused",
                "refused",
                f"after the pilot of {n} blocks: no realistic number of blocks "
                f"would show the margin {spec.margin:g} (the program's progress is too noisy)",
                sees.wall,
            )
        target = max(rs.target, n + needed)
        hours = spec.planned_hours(target)
        if hours > spec.max_hours:
            return _end(
                rs,
                "refused",
                "refused",
                f"after the pilot: the margin {spec.margin:g} needs {target} blocks "
                f"({hours:.1f} h), more than --max-hours {spec.max_hours:g}",
                sees.wall,
            )
        if target != rs.target:
            events.append(
                _event(
                    codes.AB_RUN_SIZED,
                    rs,
                    f"run {spec.run_id}: the pilot sized it to {target} blocks ({hours:.1f} h)",
                    blocks=target,
                    hours=round(hours, 3),
                )
            )
        rs = replace(rs, target=target)
    if n >= max(rs.target, pilot_of(spec) + 2):  # a run recorded with a shorter target still gets two
        a = analysis(rs)
        if a is None:  # unreachable: the run ends at least two blocks past the pilot
            raise AssertionError(f"run {spec.run_id} ended with {n} blocks, too few to analyse")
        return _end(rs, "done", a.verdict, f"{a.why}; {a.method_why}", sees.wall, a.certifies)
    return rs


#: ON windows in a row in which the work did not run before a run gives up on it
GONE_AFTER = 2


def _leave_out(rs: RunState, attempt: int, arm: Arm, why: str, sees: RunObs, events: list[TimelineEvent]) -> RunState:
    """The block is left out and repeated under the next number; a run whose work is gone,
    or that leaves out too many, ends (naming the commonest reason)."""
    spec = rs.spec
    events.append(
        _event(
            codes.AB_BLOCK_EXCLUDED,
            rs,
            f"run {spec.run_id}: block {attempt + 1} left out ({arm} window): {why}",
            block=attempt,
            arm=arm,
            why=why,
        )
    )
    rs = replace(
        rs,
        window=None,
        first=None,
        ref=None,
        attempt=rs.attempt + 1,
        excluded=(*rs.excluded, Excluded(attempt, arm, why, sees.wall)),
    )
    recent = [e.why for e in rs.excluded[-GONE_AFTER:]]
    if len(recent) == GONE_AFTER and all(WORK_GONE in r for r in recent):
        return _end(
            rs,
            "aborted",
            "aborted",
            f"the work did not run in {GONE_AFTER} ON windows in a row (it ended, or "
            "something holds it): start it again, then `arbiter ab start`",
            sees.wall,
        )
    if len(rs.excluded) > MAX_EXCLUDED_PER_BLOCK * rs.target:
        reasons = [e.why.split(":")[0] for e in rs.excluded]
        commonest = max(set(reasons), key=reasons.count)
        return _end(
            rs,
            "aborted",
            "aborted",
            f"{len(rs.excluded)} blocks were left out, most because {commonest}; run it when that no longer happens",
            sees.wall,
        )
    return rs


def _close(rs: RunState, sees: RunObs, events: list[TimelineEvent]) -> RunState:
    """The window in progress has ended: count it, leave its block out, or end the run."""
    w = rs.window
    assert w is not None
    spec = rs.spec
    reading = _reading(w, sees)
    if not sees.running:
        return _end(
            rs,
            "aborted",
            "aborted",
            f"{spec.rule_id!r}'s program stopped running: nothing to measure (start it again, then `arbiter ab start`)",
            sees.wall,
        )
    why = exclusion(w.arm, reading, spec.duty, needs_duty=spec.work != "cpu")
    if why is None and w.second and reading.events == 0 and rs.first is not None and rs.first[1].events == 0:
        why = "no progress in either window: the program was idle"
    if why is not None:
        return _leave_out(rs, w.attempt, w.arm, why, sees, events)
    if not w.second:
        return replace(rs, window=None, first=(w.arm, reading), ref=(w.phases, w.pids, w.power))
    assert rs.first is not None
    first_arm, first = rs.first
    on, off = (first, reading) if first_arm == "on" else (reading, first)
    if off.events == 0:
        return _leave_out(
            rs, w.attempt, "off", "no progress at all with the work held: the program was idle", sees, events
        )
    if collapsed(on, off.rate):
        return _end(
            rs,
            "done",
            "slowdown",
            f"progress collapsed in an ON window ({on.rate:.3g}/s against {off.rate:.3g}/s off): stopped as a slowdown",
            sees.wall,
        )
    done = BlockDone(
        w.attempt, first_arm == "on", on.events, on.seconds, off.events, off.seconds, on.work_duty, sees.wall
    )
    rs = replace(rs, window=None, first=None, ref=None, attempt=rs.attempt + 1, blocks=(*rs.blocks, done))
    events.append(
        _event(
            codes.AB_BLOCK_DONE,
            rs,
            f"run {spec.run_id}: block {len(rs.blocks)} of {rs.target}: on {done.on:.3g}/s, off {done.off:.3g}/s",
            block=w.attempt,
            on=done.on,
            off=done.off,
            on_first=done.on_first,
            work_duty=done.work_duty,
        )
    )
    return _finish(rs, sees, events)


def advance(rs: RunState | None, sees: RunObs) -> Advance:
    """One step of the run in progress (None: no run)."""
    if rs is None or not rs.running:
        return Advance(rs, ())
    events: list[TimelineEvent] = []
    spec = rs.spec
    if sees.wall - rs.started_wall > spec.max_hours * 3600:
        rs = _end(
            rs,
            "aborted",
            "aborted",
            f"the run outlived --max-hours {spec.max_hours:g} with {len(rs.blocks)} of {rs.target} blocks",
            sees.wall,
        )
    else:
        if rs.window is None:
            rs = replace(rs, window=_open(rs, sees))
        for _ in range(4):  # a late step may close one window and open the next
            assert rs.window is not None
            w = _watch(rs.window, sees)
            rs = replace(rs, window=w)
            off_rate = _last_off_rate(rs)
            if (
                w.arm == "on"
                and w.t0 is not None
                and off_rate
                and not w.disturbed
                and sees.now - w.t0 >= (spec.window_s - spec.washout_s) / 2
            ):
                so_far = _reading(w, sees)
                if collapsed(so_far, off_rate):
                    rs = _end(
                        rs,
                        "done",
                        "slowdown",
                        f"progress collapsed in an ON window ({so_far.rate:.3g}/s against "
                        f"{off_rate:.3g}/s off): stopped at once as a slowdown",
                        sees.wall,
                    )
                    break
            if sees.now < w.ends_at:
                break
            rs = _close(rs, sees, events)
            if not rs.running:
                break
            rs = replace(rs, window=_open(rs, sees))
    if rs.running:
        return Advance(rs, tuple(events))
    events.append(
        _event(
            codes.AB_RUN_DONE,
            rs,
            f"run {spec.run_id} {rs.status}: {rs.verdict} ({rs.why})",
            status=rs.status,
            verdict=rs.verdict,
            certifies=rs.certifies,
            blocks=len(rs.blocks),
            excluded=len(rs.excluded),
        )
    )
    nxt = _next_in_sweep(rs, sees.wall)
    if rs.spec.sweep_id is not None and nxt is None:
        passed = (*rs.passed, *((spec.duty,) if rs.certifies and spec.duty is not None else ()))
        best = max(passed) if passed else None
        events.append(
            _event(
                codes.AB_SWEEP_DONE,
                rs,
                f"sweep {spec.sweep_id}: "
                + (
                    f"certified duty {best:g} for {spec.rule_id!r}"
                    if best is not None
                    else f"no level passed for {spec.rule_id!r}"
                ),
                sweep=spec.sweep_id,
                passed=list(passed),
                certified_duty=best,
            )
        )
    return Advance(nxt if nxt is not None else rs, tuple(events), (rs,))


def work_seen(
    spec: RunSpec, jobs: Iterable[JobObs], running: Mapping[str, bool]
) -> tuple[bool, float | None, float | None]:
    """(some of the work runs, its mean measured duty over the last sample, when taken) from
    the jobs ``--work`` covers; ``running``: which jobs the last decision let run.  The duty
    is the mean over the jobs the run gives its duty (or, without one, its GPU jobs)."""
    covered = [j for j in jobs if covers(spec.work, j) and j.started and running.get(j.job_id)]
    if not covered:
        return False, None, None
    judged = [j for j in covered if j.uses_gpu and (spec.duty is None or "cooperative_throttle" in j.capabilities)]
    at = [j.measured_at for j in judged if j.measured_at is not None]
    if not at:
        return True, None, None
    values = [j.measured for j in judged]
    duty = None if any(v is None for v in values) else sum(v or 0.0 for v in values) / len(values)
    return True, duty, max(at)


def certified_duty(rs: RunState) -> float | None:
    """The duty a passing run certifies: the one it asked, or, for work that holds none, the
    lowest it was measured at in an ON window (never more than the work was seen to use)."""
    if rs.spec.duty is not None:
        return rs.spec.duty
    measured = [b.work_duty for b in rs.blocks]
    if not measured or any(m is None for m in measured):
        return None
    return max(0.01, math.floor(100 * min(m for m in measured if m is not None)) / 100)


# --- records (SQLite) and the report's numbers ---------------------------------------------


def to_record(rs: RunState) -> dict[str, Any]:
    """What a restart keeps; the window in progress, and a half-done block, are left out."""
    out = asdict(replace(rs, window=None, first=None, ref=None))
    for part in ("window", "first", "ref"):
        out.pop(part)
    return out


def from_record(rec: Mapping[str, Any]) -> RunState:
    spec = dict(rec["spec"])
    spec["levels"] = tuple(spec.get("levels") or ())
    return RunState(
        spec=RunSpec(**spec),
        started_wall=rec["started_wall"],
        status=rec["status"],
        target=rec["target"],
        attempt=rec["attempt"],
        blocks=tuple(BlockDone(**b) for b in rec.get("blocks") or ()),
        excluded=tuple(Excluded(**e) for e in rec.get("excluded") or ()),
        verdict=rec.get("verdict") or "",
        certifies=bool(rec.get("certifies")),
        why=rec.get("why") or "",
        ended_wall=rec.get("ended_wall"),
        passed=tuple(rec.get("passed") or ()),
    )


@dataclass(frozen=True)
class Summary:
    """The numbers a report shows beyond the blocks."""

    analysis: dict[str, Any] | None
    mostly_on: bool
    excluded_on: int
    excluded_off: int
    notes: tuple[str, ...] = field(default_factory=tuple)


def summary(rs: RunState) -> Summary:
    found = None
    notes: list[str] = []
    a = analysis(rs)
    if a is not None:
        found = asdict(a)
        if a.order_effect_flag:
            notes.append(
                f"the order inside blocks seems to matter (ON first minus OFF first: {a.order_effect:+.4f} in ln R)"
            )
        if a.lag1 is not None and abs(a.lag1) > 0.5:
            notes.append(
                f"successive blocks are correlated (lag-1 autocorrelation {a.lag1:+.2f}): the program drifts,"
                f" and the interval is {a.widening:.2f} × as wide as for independent blocks"
            )
    arms = [e.arm for e in rs.excluded]
    mostly_on = exclusions_mostly_on(arms)
    if mostly_on:
        notes.append("most left-out blocks fell in ON windows: that is harm, not chance")
    return Summary(found, mostly_on, arms.count("on"), arms.count("off"), tuple(notes))
