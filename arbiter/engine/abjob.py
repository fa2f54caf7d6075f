"""The paired run in progress, as the decision meets it: what the run says of each job (its
arm, the duty it holds, why it waits), and what the run sees of the world at each tick."""

from __future__ import annotations

from dataclasses import dataclass

from arbiter.engine import codes
from arbiter.engine.abrun import RunObs, RunState, covers, work_seen
from arbiter.engine.types import EngineState, JobObs, Observation, Policy, Reason, RuleObs, RuleVerdict


@dataclass(frozen=True)
class RunSays:
    """What the paired run in progress says of one job."""

    rule_id: str
    arm: str | None  # "on" / "off" for the work it covers; None for other GPU work (held)
    reason: Reason | None = None  # why it is held (OFF, or other work)
    duty: float | None = None  # the duty cooperative work holds in ON windows
    evict_since: float | None = None  # OFF with --off evicted: stopped since then


def run_says(run: RunState, job: JobObs) -> RunSays | None:
    """What ``run`` says of ``job``: the arm it is in when the run covers it, held for the run
    when it is other GPU work, nothing when it uses no GPU."""
    spec = run.spec
    w = run.window
    if covers(spec.work, job):
        if w is None or w.arm == "on":
            return RunSays(spec.rule_id, "on", duty=spec.duty)
        held = "evicted" if spec.off == "evicted" else "held"
        if spec.confirms:
            # the work waits for want of a certificate here, and this run is how it gets one
            message = (
                f"an OFF window of run {spec.run_id}, which confirms on this node the certificate {spec.origin} "
                f"earned for {spec.rule_id!r} (block {w.attempt + 1} of {run.target}): the work is {held} to "
                "measure the program without it"
            )
            remedy = (
                "it runs again in the next ON window; once the confirmation passes, the twin's certificate is "
                "adopted here and the work runs under it (`arbiter ab status`; `arbiter certificates`)"
            )
        else:
            message = (
                f"an OFF window of paired run {spec.run_id} on {spec.rule_id!r}: the work is {held} "
                "to measure the program without it"
            )
            remedy = (
                f"it runs again in the next ON window (`arbiter ab status`; `arbiter ab abort {spec.run_id}` "
                "ends the run)"
            )
        data = {"run": spec.run_id, "rule": spec.rule_id, "block": w.attempt}
        reason = Reason(
            codes.AB_WINDOW_OFF, message, remedy, {**data, "confirms": spec.origin} if spec.confirms else data
        )
        return RunSays(spec.rule_id, "off", reason, evict_since=w.opened_at if spec.off == "evicted" else None)
    if not job.uses_gpu:
        return None
    reason = Reason(
        codes.AB_RUN_MEASURING,
        f"paired run {spec.run_id} measures what {spec.work!r} work costs {spec.rule_id!r}"
        + (f", confirming on this node the certificate {spec.origin} earned" if spec.confirms else "")
        + ": other GPU work waits",
        f"it runs when the run ends (`arbiter ab status`; `arbiter ab abort {spec.run_id}`)",
        {"run": spec.run_id, "rule": spec.rule_id},
    )
    return RunSays(spec.rule_id, None, reason)


def run_obs(
    run: RunState, obs: Observation, rule: RuleVerdict | None, policy: Policy, prev: EngineState, now: float
) -> RunObs:
    """What ``run`` sees at this tick: its program's progress count (or why there is none), the
    program's phases, the memory guard, and whether its work ran at its duty (by the jobs'
    previous verdicts)."""
    rid = run.spec.rule_id
    ro = obs.rules.get(rid) or RuleObs(rid)
    progress = ro.progress
    count = progress.count if progress is not None and progress.readable else None
    why = "" if count is not None else (progress.why if progress is not None and progress.why else "it cannot be read")
    guard = obs.memory_available is not None and obs.memory_available < policy.governor.min_available
    running = {jid: v.state == "run" for jid, v in prev.jobs.items()}
    work_running, duty, at = work_seen(run.spec, obs.jobs.values(), running)
    return RunObs(
        now=now,
        wall=obs.wall if obs.wall is not None else now,
        count=count,
        count_why=why,
        running=ro.running,
        pids=ro.pids,
        phases=rule.phases if rule else (),
        power=obs.power,
        memory_guard=guard,
        work_running=work_running,
        work_duty=duty,
        work_sample_at=at,
    )
