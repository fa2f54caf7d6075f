"""Trust, but verify: a job's measured duty against the duty it was asked to hold.

Pure: a job's new sample, its previous compliance state and its name's trust in; the new
state, what holds it and what goes on the timeline out.  Every number is a field of
:class:`CompliancePolicy`, so tests and the node config set them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from arbiter.engine import codes
from arbiter.engine.types import CompliancePolicy, JobCompliance, JobObs, NameTrust, Reason, TimelineEvent, evolve


@dataclass(frozen=True)
class Verdict:
    """What compliance says about one job now."""

    state: JobCompliance
    trust: NameTrust
    holds: tuple[Reason, ...] = ()  # reasons to pause it from outside
    stop: Reason | None = None
    from_outside: bool = False  # it ignored a pause through its document
    events: tuple[TimelineEvent, ...] = field(default_factory=tuple)


def trust_key(job: JobObs) -> str:
    """Whose trust a job draws on: its owner's jobs of its name.  One account's jobs that
    overran their duty must cost another account's jobs of the same name nothing."""
    return f"{job.owner_uid}:{job.name}"


def untrusted_reason(name: str, trust: NameTrust, now: float, governed: bool = False) -> Reason:
    """Why a run of an untrusted name waits.  ``governed``: a certificate would have let it
    run beside a protected program under the budget, which its name is not trusted with."""
    left = max(0.0, (trust.untrusted_until or now) - now)
    return Reason(
        codes.JOB_UNTRUSTED,
        f"job name {name!r} was stopped for exceeding its GPU duty "
        f"{'once' if len(trust.strikes) == 1 else f'{len(trust.strikes)} times'} within the hour; "
        f"its runs get no duty for another {max(1, math.ceil(left / 60)):d} min"
        + (", so it waits like work that cannot throttle instead of running under the budget" if governed else ""),
        f"it is trusted again in {max(1, math.ceil(left / 60)):d} min; "
        "meanwhile fix the job so it holds its duty (`arbiter conform` checks it)",
        {"name": name, "untrusted_for_s": round(left, 1), "strikes": len(trust.strikes)},
    )


def prune(trust: NameTrust, cp: CompliancePolicy, now: float) -> NameTrust:
    """Forget strikes older than the window and a distrust that has run out."""
    strikes = tuple(t for t in trust.strikes if now - t < cp.strike_window_s)
    until = trust.untrusted_until if trust.untrusted_until is not None and now < trust.untrusted_until else None
    return evolve(trust, strikes=strikes, untrusted_until=until)


def check(
    job: JobObs,
    asked: float | None,
    capped: bool,
    told_paused: bool,
    jc: JobCompliance,
    trust: NameTrust,
    cp: CompliancePolicy,
    busy_threshold: float,
    now: float,
) -> Verdict:
    """Take the job's new sample, if any.

    :param asked: the duty it was asked to hold over the sample (None: it was not running
        under a duty below 1, so there is nothing to verify).
    :param capped: it would run at a duty below 1, so what it uses must be readable.
    :param told_paused: its control document says paused (a cooperative pause); the
        decision that said so set ``jc.told_at``.
    """
    events: list[TimelineEvent] = []
    trust = prune(trust, cp, now)
    if not told_paused:
        jc = evolve(jc, told_at=None, busy_while_told_paused=0)
    fresh = job.measured_at is not None and (jc.last_sample_at is None or job.measured_at > jc.last_sample_at)
    if fresh:
        assert job.measured_at is not None
        began = jc.last_sample_at if jc.last_sample_at is not None else job.measured_at - cp.sample_s
        under_this_duty = jc.asked_since is not None and began >= jc.asked_since
        # a sample counts against a pause only when all of it came after the job was told
        after_told = jc.told_at is not None and jc.last_sample_at is not None and jc.last_sample_at >= jc.told_at
        jc = evolve(
            jc, last_sample_at=job.measured_at, measured=job.measured, unverified=capped and job.measured is None
        )
        if told_paused:
            using = job.measured is None or job.measured > busy_threshold
            count = (
                jc.busy_while_told_paused + 1 if using and after_told else 0 if not using else jc.busy_while_told_paused
            )
            jc = evolve(jc, busy_while_told_paused=count, over=0)
        elif asked is not None and job.measured is not None:
            if not under_this_duty:
                pass  # part of the sample ran under another duty: it says nothing either way
            else:
                jc = evolve(jc, over=jc.over + 1 if job.measured > asked + cp.tolerance else 0)
            jc = evolve(jc, busy_while_told_paused=0)
        else:
            jc = evolve(jc, over=0, busy_while_told_paused=0)
        if jc.over >= cp.over_samples and asked is not None:
            strikes = (*trust.strikes, now)
            data: dict[str, Any] = {
                "job": job.job_id,
                "name": job.name,
                "asked": asked,
                "measured": job.measured,
                "strikes": len(strikes),
            }
            if len(strikes) >= cp.strikes_to_stop:
                trust = NameTrust(strikes, now + cp.untrusted_s)
                jc = evolve(jc, over=0, stopped_at=now)
                events.append(
                    TimelineEvent(
                        codes.JOB_UNTRUSTED,
                        job.job_id,
                        f"job {job.name} exceeded its duty a {len(strikes)}th time within the hour: stopped, and its name "
                        f"gets no duty for {cp.untrusted_s / 60:.0f} min",
                        data,
                    )
                )
            else:
                trust = NameTrust(strikes, trust.untrusted_until)
                jc = evolve(jc, over=0, paused_until=now + cp.pause_s)
                events.append(
                    TimelineEvent(
                        codes.GPU_DUTY_EXCEEDED,
                        job.job_id,
                        f"job {job.name} ran at {job.measured:.2f} for {cp.over_samples} samples, over its duty {asked:.2f} "
                        f"+ {cp.tolerance:g}: paused {cp.pause_s:g}s (strike {len(strikes)} of {cp.strikes_to_stop})",
                        data,
                    )
                )
    if not capped:
        jc = evolve(jc, unverified=False)

    holds: list[Reason] = []
    stop: Reason | None = None
    if jc.stopped_at is not None:
        stop = untrusted_reason(job.name, trust, now)
    if jc.paused_until is not None:
        if now < jc.paused_until:
            holds.append(
                Reason(
                    codes.GPU_DUTY_EXCEEDED,
                    f"it used more of the GPU than its duty for {cp.over_samples} samples in a row "
                    f"(last measured {jc.measured if jc.measured is not None else 0:.2f}); paused for "
                    f"{jc.paused_until - now:.0f}s more",
                    f"make the job hold its duty (arbiter.sdk.Duty); {cp.strikes_to_stop} such pauses within an hour stop it",
                    {
                        "job": job.job_id,
                        "paused_until_s": round(jc.paused_until - now, 1),
                        "strikes": len(trust.strikes),
                    },
                )
            )
        else:
            jc = evolve(jc, paused_until=None)
    if jc.unverified:  # until a readable sample says otherwise: fail safe between ticks too
        holds.append(
            Reason(
                codes.GPU_DUTY_UNVERIFIED,
                "its GPU time cannot be read, so the duty it holds cannot be verified",
                "use a reader that reads per-process GPU time here (`arbiter status` shows why none does)",
                {"job": job.job_id},
            )
        )
    return Verdict(jc, trust, tuple(holds), stop, jc.busy_while_told_paused >= cp.still_busy_samples, tuple(events))


# --- persistence: times are monotonic here, wall clock on disk ------------------------------


def trust_to_record(trust: NameTrust, now: float, now_wall: float) -> dict[str, Any]:
    def wall(t: float) -> float:
        return now_wall - (now - t)

    return {
        "strikes": [wall(t) for t in trust.strikes],
        "untrusted_until": None if trust.untrusted_until is None else wall(trust.untrusted_until),
    }


def trust_from_record(record: dict[str, Any], now: float, now_wall: float) -> NameTrust:
    def mono(t: float) -> float:
        return now - (now_wall - t)

    until = record.get("untrusted_until")
    return NameTrust(
        tuple(mono(float(t)) for t in record.get("strikes", [])), None if until is None else mono(float(until))
    )
