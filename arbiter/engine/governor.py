"""The budget governor (under ``gpu_jobs: certified``, one per rule).

Pure: a rule's governor state, its progress reading, its ceiling, the memory guard and a
time in; the new state, the budget, what holds cooperative work and the timeline out.

- First hold GPU work for ``baseline_s`` to measure the program's progress without it
  (``GPU_DUTY_BASELINE``); again every ``rebaseline_s``.  Then run at the ceiling the first
  time, at the last level after a re-baseline (``GPU_DUTY_START``).
- Every ``period_s``: pressure = 1 − rate/baseline; the governor keeps the sensitivity
  (pressure per unit of duty, smoothed over the periods) and moves the budget to where it puts
  the pressure on the aim, 85 % of the target: at most ``grow_step`` up a period, up to the
  ceiling.  pressure ≥ target: the sensitivity is that period's alone, so the budget steps back
  by the overshoot (budget × aim / pressure) at once.  pressure > 2 × target, or progress under
  half the baseline, or the memory guard: budget 0 for ``take_back_s``, then start again at
  half the level taken back.  An unreadable progress source: 0 until it reads.
- A ceiling below the budget (a lower or expired certificate) clamps it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from arbiter.engine import codes
from arbiter.engine.types import CertView, GovernorPolicy, GovernorState, Reason, SourceObs, TimelineEvent


def covers(work: str, job_name: str) -> bool:
    return work in ("gpu", "all") or work == job_name


def ceiling(certs: Iterable[CertView], rule_id: str, job_names: Sequence[str]) -> float:
    """The highest duty among the rule's valid certificates whose work covers every running
    cooperative GPU job (0: none does)."""
    best = 0.0
    for cert in certs:
        if cert.rule_id == rule_id and cert.valid and all(covers(cert.work, n) for n in job_names):
            best = max(best, cert.duty)
    return best


#: the share of the target the governor aims the pressure at, so that a period's noise seldom
#: carries it over the target
AIM = 0.9
#: ... and the share it aims a step back at: further under, so that one step back is enough
#: even when the period that went over read high
STEP_BACK_AIM = 0.75
#: the weight of the newest period in the smoothed sensitivity (pressure per unit of duty)
SMOOTHING = 0.4


def sensitivity(previous: float | None, budget: float, pressure: float, over: bool) -> float | None:
    """Pressure per unit of duty, smoothed across periods: the newest period alone when the
    pressure is over the target (a change of load must be answered at once), none while the
    budget is 0, and a pressure at or under 0 counts as 0 (no slowdown seen at that duty)."""
    if budget <= 0:
        return previous
    now = max(pressure, 0.0) / budget
    if over or previous is None:
        return now
    return (1 - SMOOTHING) * previous + SMOOTHING * now


#: the least spread of duty between two periods for the slope between them to mean anything
MIN_SPREAD = 0.02


def step_back(budget: float, pressure: float, probe: tuple[float, float] | None, aim: float) -> float:
    """The budget after a period over the target: through the origin (budget × aim / pressure),
    or, where the period before ran lower and under the aim, on the line between the two periods
    when that is higher (a slowdown that starts only past some duty: the line through the origin
    would step back past the knee).  Both lie over a convex curve, so neither oversteps it."""
    back = budget * aim / pressure
    if probe is not None:
        duty, was = probe
        if budget - duty >= MIN_SPREAD and was < aim < pressure:
            back = max(back, duty + (aim - was) * (budget - duty) / (pressure - was))
    return round(min(back, budget), 4)


def next_budget(budget: float, slope: float | None, aim: float, step: float, top: float) -> float:
    """The duty at which the smoothed sensitivity puts the pressure on the aim (aim / slope), at
    most ``step`` above the budget and never above ``top``.  Where the slowdown is not
    proportional to the duty the sensitivity is that of the duty it was measured at, so the
    search settles where the pressure meets the aim on any rising curve."""
    wanted = budget + step if not slope else min(aim / slope, budget + step)
    return round(max(0.0, min(top, wanted)), 4)


@dataclass(frozen=True)
class Step:
    state: GovernorState
    hold: Reason | None  # why cooperative GPU work gets no duty now (budget 0)
    events: tuple[TimelineEvent, ...]


def _event(code: str, rid: str, message: str, gs: GovernorState, **data: Any) -> TimelineEvent:
    return TimelineEvent(
        code, rid, message, {"rule": rid, "budget": round(gs.budget, 4), "ceiling": gs.ceiling, **data}
    )


def stand_down(gs: GovernorState) -> GovernorState:
    """The rule no longer holds GPU work back: nothing to govern; its baseline and last
    level are kept for when it does again, and so is a take-back still running (one
    ungoverned moment must not cut it short)."""
    level = gs.budget if gs.mode == "running" else gs.level
    return GovernorState(
        level=level,
        baseline=gs.baseline,
        baseline_at=gs.baseline_at,
        ceiling=gs.ceiling,
        take_back_until=gs.take_back_until if gs.mode in ("taken_back", "off") else None,
    )


def step(
    rid: str,
    gs: GovernorState,
    progress: SourceObs | None,
    top: float,
    target: float,
    memory_available: float | None,
    gp: GovernorPolicy,
    now: float,
) -> Step:
    """One decision of one rule's governor, which holds GPU work back and has a ceiling ``top``."""
    events: list[TimelineEvent] = []
    rate = progress.rate if progress is not None and progress.readable else None
    gs = replace(gs, ceiling=top)

    def baseline(why: str) -> GovernorState:
        new = replace(gs, mode="baseline", since=now, budget=0.0, take_back_until=None, probe=None)
        events.append(
            _event(
                codes.GPU_DUTY_BASELINE, rid, f"measuring {rid!r} without GPU work for {gp.baseline_s:g}s ({why})", new
            )
        )
        return new

    if gs.mode == "off" and gs.take_back_until is not None and now < gs.take_back_until:
        gs = replace(gs, mode="taken_back", budget=0.0)  # it was taken back; that still holds
    elif gs.mode == "off":
        if gs.baseline is not None and gs.baseline_at is not None and now - gs.baseline_at < gp.rebaseline_s:
            start = top if gs.level is None else min(gs.level, top)
            gs = replace(gs, mode="running", since=now, budget=start, decided_at=now)
            events.append(
                _event(
                    codes.GPU_DUTY_START,
                    rid,
                    f"holding GPU work again; its baseline is recent: cooperative GPU work runs at {start:.2f}",
                    gs,
                )
            )
        else:
            gs = baseline("first baseline" if gs.baseline is None else "the last is too old to reuse")
    elif gs.mode == "running" and gs.baseline_at is not None and now - gs.baseline_at >= gp.rebaseline_s:
        gs = replace(baseline(f"the last is {gp.rebaseline_s:g}s old"), level=gs.budget)

    if gs.mode == "baseline" and gs.since is not None and now - gs.since >= gp.baseline_s:
        if rate is None:
            pass  # no baseline without a reading: keep holding until it reads
        else:
            start = top if gs.level is None else min(gs.level, top)
            gs = replace(
                gs,
                mode="running",
                since=now,
                baseline=rate,
                baseline_at=now,
                budget=start,
                decided_at=now,
                pressure=None,
            )
            events.append(
                _event(
                    codes.GPU_DUTY_START,
                    rid,
                    f"baseline {rate:.3g}/s; cooperative GPU work runs at {start:.2f}",
                    gs,
                    baseline=rate,
                )
            )

    if gs.mode == "taken_back" and gs.take_back_until is not None and now >= gs.take_back_until:
        start = min(top, round((gs.level or 0.0) / 2, 4))
        gs = replace(gs, mode="running", since=now, budget=start, decided_at=now, take_back_until=None)
        events.append(
            _event(codes.GPU_DUTY_START, rid, f"taken back {gp.take_back_s:g}s ago; starting again at {start:.2f}", gs)
        )

    def take_back(why: str) -> GovernorState:
        new = replace(
            gs,
            mode="taken_back",
            since=now,
            level=gs.budget,
            budget=0.0,
            take_back_until=now + gp.take_back_s,
            decided_at=now,
            probe=None,  # a period from before is no line to step back on
        )
        events.append(_event(codes.GPU_DUTY_TAKE_BACK, rid, f"budget 0 for {gp.take_back_s:g}s: {why}", new))
        return new

    if gs.mode == "running":
        base_rate = gs.baseline
        if memory_available is not None and memory_available < gp.min_available:
            gs = take_back(f"host memory available {100 * memory_available:.0f}% < {100 * gp.min_available:.0f}%")
        elif rate is not None and base_rate and gs.decided_at is not None and now - gs.decided_at >= gp.period_s:
            pressure = 1.0 - rate / base_rate
            aim = AIM * target
            gs = replace(gs, pressure=pressure, decided_at=now)
            data = {"pressure": round(pressure, 4), "rate": rate, "baseline": base_rate, "target": target}
            if pressure > 2 * target or rate < base_rate / 2:
                gs = take_back(
                    f"progress {rate:.3g}/s against a baseline of {base_rate:.3g}/s (pressure {pressure:.1%})"
                )
            else:
                over = pressure >= target
                slope = sensitivity(gs.sensitivity, gs.budget, pressure, over)
                probe = gs.probe
                gs = replace(gs, sensitivity=slope, probe=(gs.budget, pressure))
                if over:
                    gs = replace(gs, budget=step_back(gs.budget, pressure, probe, STEP_BACK_AIM * target))
                    events.append(
                        _event(
                            codes.GPU_DUTY_HALVE,
                            rid,
                            f"pressure {pressure:.1%} ≥ target {target:.0%}: budget stepped back to"
                            f" {gs.budget:.2f}, aiming at {STEP_BACK_AIM * target:.1%}",
                            gs,
                            **data,
                        )
                    )
                else:
                    new = next_budget(gs.budget, slope, aim, gp.grow_step, top)
                    if new != gs.budget:
                        code = codes.GPU_DUTY_GROW if new > gs.budget else codes.GPU_DUTY_HALVE
                        verb = "grows" if new > gs.budget else "eases"
                        gs = replace(gs, budget=new)
                        events.append(
                            _event(
                                code,
                                rid,
                                f"pressure {pressure:.1%} (aim {aim:.1%}, {slope or 0:.3f} per unit of duty):"
                                f" budget {verb} to {gs.budget:.2f}",
                                gs,
                                **data,
                            )
                        )
        if gs.mode == "running" and gs.budget > top:
            gs = replace(gs, budget=top)
            events.append(_event(codes.GPU_DUTY_CLAMP, rid, f"certificate ceiling {top:.2f}: budget clamped", gs))

    hold = None
    if gs.mode == "baseline":
        hold = Reason(
            codes.GPU_DUTY_BASELINE,
            f"measuring how {rid!r} progresses without GPU work"
            + ("" if rate is not None else " (its progress source does not read yet)"),
            f"it runs once the {gp.baseline_s:g}s baseline is measured",
            {"rule": rid},
        )
    elif gs.mode == "taken_back":
        left = (gs.take_back_until or now) - now
        hold = Reason(
            codes.GPU_DUTY_TAKE_BACK,
            f"{rid!r} was harmed: GPU work gets no duty for {left:.0f}s more",
            "nothing to do: the budget comes back on its own",
            {"rule": rid},
        )
    elif rate is None:
        hold = Reason(
            codes.PROTECTION_SOURCE_UNREADABLE,
            f"the progress of {rid!r} cannot be read, so the budget is 0 until it reads",
            "`arbiter status` shows the source and why it does not read",
            {"rule": rid},
        )
    elif gs.budget <= 0:
        hold = Reason(
            codes.GPU_DUTY_HALVE,
            f"the budget beside {rid!r} is 0",
            "it grows while the program keeps up",
            {"rule": rid},
        )
    return Step(gs, hold, tuple(events))


# --- persistence: times are monotonic here, wall clock on disk ------------------------------

_TIMES = ("since", "baseline_at", "decided_at", "take_back_until")


def to_record(gs: GovernorState, now: float, now_wall: float) -> dict[str, Any]:
    out: dict[str, Any] = {
        "mode": gs.mode,
        "baseline": gs.baseline,
        "budget": gs.budget,
        "level": gs.level,
        "ceiling": gs.ceiling,
        "pressure": gs.pressure,
        "sensitivity": gs.sensitivity,
        "probe": None if gs.probe is None else list(gs.probe),
    }
    for name in _TIMES:
        t = getattr(gs, name)
        out[name] = None if t is None else now_wall - (now - t)
    return out


def from_record(record: dict[str, Any], now: float, now_wall: float) -> GovernorState:
    times = {n: (None if record.get(n) is None else now - (now_wall - float(record[n]))) for n in _TIMES}
    return GovernorState(
        mode=record.get("mode", "off"),
        baseline=record.get("baseline"),
        budget=float(record.get("budget", 0.0)),
        level=record.get("level"),
        ceiling=float(record.get("ceiling", 0.0)),
        pressure=record.get("pressure"),
        sensitivity=record.get("sensitivity"),
        probe=None if not record.get("probe") else (float(record["probe"][0]), float(record["probe"][1])),
        **times,
    )
