"""What a phase change of an immediate rule does at once, before the whole decision runs.

A decision weighs every rule and every job: with a hundred rules and fifty jobs it took
several milliseconds, and under load more, between a phase line being written and the
first job stopping.  The reflex answers from the last decision alone, in microseconds:

- a phase that turns on pauses, by its process tree, every started job its scope covers
  that the last decision let run, those measured using the most GPU time first (pausing is
  the safe direction; a cooperative job is told through its control document by the
  decision itself);
- a phase that turns off resumes the jobs the last decision paused by their tree for this
  phase and nothing else.

The reflex process acts on this, armed by the daemon after each decision with the answer
for each phase value.  The whole decision follows at once and has the last word: it pauses
what the reflex left, and resumes what the reflex paused wrongly.
"""

from __future__ import annotations

from dataclasses import dataclass

from arbiter.engine.holds import effective_phase, in_scope
from arbiter.engine.types import Decision, JobVerdict, Observation, Policy, Reason, SourceObs


@dataclass(frozen=True)
class Reflex:
    pause: tuple[str, ...] = ()  # job ids
    resume: tuple[str, ...] = ()


def reflex(obs: Observation, last: Decision, policy: Policy, rule_id: str, index: int, source: SourceObs) -> Reflex:
    """The jobs to pause or resume now that phase source ``index`` of ``rule_id`` reads
    ``source``.

    :param obs: the observation the last decision was made on.
    :param last: that decision.
    """
    rp = policy.rules.get(rule_id)
    ro = obs.rules.get(rule_id)
    if rp is None or ro is None or not rp.immediate or not 0 <= index < len(rp.during):
        return Reflex()
    phase, _ = effective_phase(source, ro.running, bool(ro.faults))
    if phase == "soon":
        return Reflex()  # it pauses cooperative jobs only, through their control documents
    scope = rp.during[index].scope
    pause: list[str] = []
    resume: list[str] = []
    for job_id, verdict in last.jobs.items():
        job = obs.jobs.get(job_id)
        if job is None or not job.started or job.stop_requested_at is not None or not in_scope(scope, job):
            continue
        if phase == "on" and verdict.state == "run" and not job.cooperative_pause:
            pause.append(job_id)
        elif phase == "off" and _held_by_this_phase_alone(verdict, rule_id, index):
            resume.append(job_id)
    # each signal wakes its target, and fifty of them take a millisecond or more: the jobs
    # taking the most GPU time from the protected program stop first
    pause.sort(key=lambda jid: -(obs.jobs[jid].measured or 0.0))
    return Reflex(tuple(pause), tuple(resume))


def _held_by_this_phase_alone(verdict: JobVerdict, rule_id: str, index: int) -> bool:
    return (
        verdict.state == "paused"
        and verdict.via == "tree"
        and bool(verdict.reasons)
        and all(_of_this_phase(r, rule_id, index) for r in verdict.reasons)
    )


def _of_this_phase(reason: Reason, rule_id: str, index: int) -> bool:
    return reason.evidence.get("rule") == rule_id and reason.evidence.get("during") == index
