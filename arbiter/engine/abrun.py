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
- A run that reaches its target inconclusive with R above 1 − margin runs on to the blocks its
  hours leave and is judged again there (two looks, the error split between them).
- After the pilot (the first ``pilot`` blocks) the run is sized with the upper 80 %
  confidence limit of the SD; one that cannot reach the margin within ``max_hours`` is
  refused.  The pilot is then left out of R and its interval (:mod:`arbiter.engine.abstats`).  A run that outlives ``max_hours`` or leaves out too many blocks is aborted.
- A sweep is a run per level; a run that passes starts the next level, the first that does
  not ends the sweep.

The run's values are :mod:`arbiter.engine.abstate`'s, a window's life
:mod:`arbiter.engine.abwindow`'s, its record and report :mod:`arbiter.engine.abrecord`'s
(all offered here too); planning and statistics are :mod:`arbiter.engine.abplan` and
:mod:`arbiter.engine.abstats`.

One module past 400 lines: a run's steps (windows, exclusions, the pilot, the looks, the end)
read as one state machine, and each is short.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from arbiter.engine import codes
from arbiter.engine.abplan import WORK_GONE, Arm, collapsed, exclusion, order
from arbiter.engine.abrecord import Summary, certified_duty, from_record, summary, to_record
from arbiter.engine.abstate import (
    DEFAULT_LEVELS,
    MAX_EXCLUDED_PER_BLOCK,
    BlockDone,
    Excluded,
    OffMode,
    RunSpec,
    RunState,
    RunStatus,
    analysis,
    pilot_of,
    start,
)
from arbiter.engine.abstats import FIRST_LOOK_CONFIDENCE, Block, blocks_needed, blocks_within, runs_on
from arbiter.engine.abwindow import RunObs, Window, measured, watch
from arbiter.engine.values import JobObs, TimelineEvent

__all__ = [
    "DEFAULT_LEVELS",
    "MAX_EXCLUDED_PER_BLOCK",
    "Advance",
    "BlockDone",
    "Excluded",
    "OffMode",
    "RunObs",
    "RunSpec",
    "RunState",
    "RunStatus",
    "Summary",
    "Window",
    "abort",
    "advance",
    "analysis",
    "certified_duty",
    "covers",
    "from_record",
    "pilot_of",
    "start",
    "summary",
    "to_record",
    "work_seen",
]


def covers(work: str, job: JobObs) -> bool:
    """Whether ``--work`` names this job: ``gpu`` every GPU job, ``cpu`` every other, ``all``
    both, else the job's name."""
    if work == "gpu":
        return job.uses_gpu
    if work == "cpu":
        return not job.uses_gpu
    return work == "all" or work == job.name


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
        # the blocks the hours leave at the pace the run has kept (its exclusions and the steps'
        # lateness included), so that running on cannot outlive --max-hours and be aborted
        elapsed = sees.wall - rs.started_wall
        pace = max(elapsed / n, 2 * spec.window_s)  # per block counted
        more = max(0, math.floor((spec.max_hours * 3600 - elapsed) / pace))
        if not rs.looked and more > 0 and a.confidence == FIRST_LOOK_CONFIDENCE and runs_on(a, spec.margin):
            target = n + more
            events.append(
                _event(
                    codes.AB_RUN_EXTENDED,
                    rs,
                    f"run {spec.run_id}: inconclusive at its first look (R {a.r:.4f}, {a.confidence * 100:g} % interval"
                    f" {a.low:.4f}–{a.high:.4f}); it runs on to {target} blocks and is judged again there",
                    blocks=target,
                    looked=n,
                    hours=round(spec.planned_hours(target - n), 3),
                )
            )
            return replace(rs, target=target, looked=n)
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
    reading = measured(w, sees)
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
            w = watch(rs.window, sees)
            rs = replace(rs, window=w)
            off_rate = _last_off_rate(rs)
            if (
                w.arm == "on"
                and w.t0 is not None
                and off_rate
                and not w.disturbed
                and sees.now - w.t0 >= (spec.window_s - spec.washout_s) / 2
            ):
                so_far = measured(w, sees)
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
    if rs.verdict == "the effect changed":
        events.append(_event(codes.AB_EFFECT_CHANGED, rs, f"run {spec.run_id}: the effect changed during the run"))
    elif rs.verdict == "inconclusive" and (a := analysis(rs)) is not None and a.ends_short:
        events.append(
            _event(
                codes.AB_ENDS_NOT_SHOWN,
                rs,
                f"run {spec.run_id}: the effect over the run's first or last {a.end_blocks} blocks is not shown within"
                " the margin",
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
