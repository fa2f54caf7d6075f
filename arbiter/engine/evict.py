"""Eviction: a running job that protection keeps paused too long is stopped.

A job paused for a protected program waits on this node however long the program needs the
GPU.  Where a scheduler places the work (a batch system's job that may be requeued), that
wait is better spent on another node: past ``evict_after_s`` of one unbroken protection
pause, the job is stopped like any stopped job (asked, terminated, killed after the grace),
and the terminate translator hands it back to its scheduler where it can.

The clock runs while the job is paused with a reason that is the node's protection (a
protected program on the GPU or in a phase, its sources or readers failing, the governor
holding the budget at 0, another tenant taking its VRAM) and never while its owner holds it:
an owner's pause is theirs to end.  It starts again from zero once the job runs again.  Once a
job is evicted its stop goes on, even if the protected program ends meanwhile: a stop half
done (a batch job requeued) cannot be taken back.
"""

from __future__ import annotations

from arbiter.engine import codes
from arbiter.engine.types import HeldJob, JobObs, JobVerdict, Reason

#: the reasons of a pause that count towards eviction: the node's protection holds the job
PROTECTION = frozenset(
    {
        codes.PROTECTED_GPU_BUSY,
        codes.GPU_NOT_CERTIFIED,
        codes.RULE_PAUSE_FLEET,
        codes.PROTECTION_PHASE_ON,
        codes.PROTECTION_SOURCE_UNREADABLE,
        codes.PROTECTION_SOURCE_NEEDS_HELPER,
        codes.PLUGIN_FAILED,
        codes.GPU_TIME_UNREADABLE,
        codes.GPU_DUTY_BASELINE,
        codes.GPU_DUTY_TAKE_BACK,
        codes.JOB_PAUSED_FOR_VRAM,
    }
)
#: a pause with one of these never counts: the job's owner holds it
OWNERS = frozenset({codes.JOB_HELD_BY_USER})


def protection(verdict: JobVerdict) -> Reason | None:
    """The first reason protection pauses the job for, if its pause counts towards eviction."""
    if verdict.state != "paused" or any(r.code in OWNERS for r in verdict.reasons):
        return None
    return next((r for r in verdict.reasons if r.code in PROTECTION), None)


def step(job: JobObs, verdict: JobVerdict, prev: HeldJob | None, after_s: float | None, now: float) -> HeldJob | None:
    """The job's protection pause after this decision (None: it is not paused by protection).

    ``verdict``: what the rest of the decision says of the job now; ``after_s``: the policy's
    ``evict_after_s`` (None: never evict, the pause is still timed)."""
    if prev is not None and prev.evicted_at is not None:
        return prev
    first = protection(verdict) if job.started else None
    if first is None:
        return None
    since = prev.since if prev is not None else now
    if after_s is None or now - since < after_s:
        return prev if prev is not None else HeldJob(since)
    return HeldJob(since, now, reason(first, now - since, after_s))


def reason(first: Reason, held_s: float, after_s: float) -> Reason:
    rule = first.evidence.get("rule")
    return Reason(
        codes.JOB_EVICTED,
        f"protection kept it paused for {held_s:.0f}s, past evict_after_s ({after_s:g}s), "
        f"so it is stopped to run elsewhere; it was paused because {first.message}",
        "work handed back to its scheduler by the terminate translator (a batch job that may be requeued) is "
        "placed again on a node that admits it; other work ends here: start it again where it is admitted. "
        "evict_after_s in arbiter.yaml sets how long protection may pause a job before it is stopped (null: never)",
        {"held_s": round(held_s, 1), "evict_after_s": after_s, "held_for": first.code, "rule": rule},
    )


def evicted_by(verdict: JobVerdict | None) -> str | None:
    """The rule whose protection evicted the job, where its verdict is an eviction's stop."""
    if verdict is None:
        return None
    rule = next((r.evidence.get("rule") for r in verdict.reasons if r.code == codes.JOB_EVICTED), None)
    return str(rule) if rule else None
