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
done (a batch job requeued) cannot be taken back.  It goes on for the run it stopped only: a
job placed back on this node, its root process a new one, is a new run.

``evict_after_s: auto`` chooses the wait from what this node has seen.  Waiting loses the
time protection still lasts; evicting loses ``evict_cost_s`` (the job placed again elsewhere,
and the work it loses).  Each rule keeps how long its latest protections held fleet work; the
wait chosen is the one that, over those protections, would have lost least (0: evict at once
where protection usually outlasts an eviction's cost, the longest seen where it never does).
Before any protection of the rule has ended, the wait is the cost itself: whatever protection
then does, that loses at most twice what the best choice would have.  Where no other node has
room yet, the evicted job waits in its scheduler's queue and is placed as soon as one frees,
this one included: sooner than a job still paused here could be evicted then.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from arbiter.engine import codes
from arbiter.engine.types import HeldJob, JobObs, JobVerdict, Reason, RuleState, evolve

#: how many of a rule's latest protections ``auto`` weighs
SPANS_KEPT = 20

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


def record(rs: RuleState, holding: bool, now: float) -> RuleState:
    """The rule's state with this decision's protection counted: a protection that ends adds
    how long it held fleet work to the rule's latest ones."""
    if holding:
        return rs if rs.holding_since is not None else evolve(rs, holding_since=now)
    if rs.holding_since is None:
        return rs
    return evolve(rs, holding_since=None, held_spans=(*rs.held_spans, now - rs.holding_since)[-SPANS_KEPT:])


def auto_wait(rule: str | None, spans: Sequence[float], cost_s: float) -> tuple[float, str]:
    """How long a job paused by ``rule``'s protection waits before it is evicted, and why:
    the wait that, over the rule's latest protections (``spans``, in seconds), loses least,
    each losing the time it waited and, where the protection outlasted the wait, ``cost_s``."""
    who = repr(rule) if rule else "this protection"
    if not spans:
        return cost_s, (
            f"no protection by {who} has ended here yet: it waits as long as an eviction costs "
            f"(evict_cost_s {cost_s:g}s), which loses at most twice what the best wait would"
        )

    def loss(wait: float) -> float:
        return sum(min(span, wait) + (cost_s if span > wait else 0.0) for span in spans)

    best = min({0.0, *spans}, key=lambda wait: (loss(wait), -wait))  # a tie waits: no requeue for nothing
    ordered = sorted(spans)
    seen = (
        f"the last {len(spans)} protection(s) by {who} held fleet work {ordered[len(ordered) // 2]:.0f}s at the median "
        f"({ordered[0]:.0f}s to {ordered[-1]:.0f}s); an eviction costs {cost_s:g}s (evict_cost_s)"
    )
    if best == 0.0:
        return 0.0, f"{seen}: protection usually outlasts that, so it is evicted at once"
    if best >= ordered[-1]:
        return best, f"{seen}: waiting the longest of them loses least, so it waits {best:.0f}s"
    return best, f"{seen}: waiting {best:.0f}s, then evicting, loses least"


def step(
    job: JobObs,
    verdict: JobVerdict,
    prev: HeldJob | None,
    after_s: float | Literal["auto"] | None,
    now: float,
    spans: Mapping[str, Sequence[float]] | None,
    cost_s: float,
) -> HeldJob | None:
    """The job's protection pause after this decision (None: it is not paused by protection).

    ``verdict``: what the rest of the decision says of the job now; ``after_s``: the policy's
    ``evict_after_s`` (None: never evict, the pause is still timed; "auto": from ``spans``,
    each rule's latest protections, and ``cost_s``, see :func:`auto_wait`)."""
    if prev is not None and prev.evicted_at is not None:
        return prev
    first = protection(verdict) if job.started else None
    if first is None:
        return None
    since = prev.since if prev is not None else now
    limit, basis = after_s, ""
    if limit == "auto":
        # a tenant taking the job's VRAM is a rule too, named as the tenant
        rule = first.evidence.get("rule") or first.evidence.get("tenant")
        rule = str(rule) if rule else None
        limit, basis = auto_wait(rule, (spans or {}).get(rule or "", ()), cost_s)
    if limit is None or now - since < limit:
        return HeldJob(since, after_s=limit, basis=basis)
    return HeldJob(since, now, reason(first, now - since, limit, basis), limit, basis, job.run)


def ran_again(job: JobObs, held: HeldJob) -> bool:
    """Whether an evicted job runs here again as a new run (a scheduler placed it back on this
    node): its root process is not the one its eviction stopped.  That run is a job seen for
    the first time: the eviction's stop, and its grace, were for the run before."""
    return held.evicted_at is not None and None not in (job.run, held.run) and job.run != held.run


def reason(first: Reason, held_s: float, after_s: float, basis: str = "") -> Reason:
    rule = first.evidence.get("rule")
    past = f"evict_after_s ({after_s:g}s)" if not basis else f"evict_after_s (auto: {after_s:g}s, because {basis})"
    evidence = {"held_s": round(held_s, 1), "evict_after_s": after_s, "held_for": first.code, "rule": rule}
    if basis:
        evidence["evict_basis"] = basis
    return Reason(
        codes.JOB_EVICTED,
        f"protection kept it paused for {held_s:.0f}s, past {past}, "
        f"so it is stopped to run elsewhere; it was paused because {first.message}",
        "work handed back to its scheduler by the terminate translator (a batch job that may be requeued) is "
        "placed again on a node that admits it; other work ends here: start it again where it is admitted. "
        "evict_after_s in arbiter.yaml sets how long protection may pause a job before it is stopped (null: never; "
        "auto: from how long this node's protections last, against evict_cost_s)",
        evidence,
    )


def evicted_by(verdict: JobVerdict | None) -> str | None:
    """The rule whose protection evicted the job, where its verdict is an eviction's stop."""
    if verdict is None:
        return None
    rule = next((r.evidence.get("rule") for r in verdict.reasons if r.code == codes.JOB_EVICTED), None)
    return str(rule) if rule else None
