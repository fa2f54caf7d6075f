"""What a change in a job's verdict means: the idempotent actions that carry it out, and the
timeline entries that tell it.  Both are pure functions of the job and its two verdicts."""

from __future__ import annotations

from arbiter.engine import codes
from arbiter.engine.types import Action, JobObs, JobVerdict, TimelineEvent


def change_actions(job: JobObs, prev: JobVerdict | None, new: JobVerdict) -> list[Action]:
    """What changes between two verdicts, as idempotent actions."""
    reason = "; ".join(r.message for r in new.reasons)
    before = prev.state if prev else "held"
    if new.state == "stopping":
        steps = {"asked": 0, "terminated": 1, "killed": 2}
        done = steps[prev.stop_step] if prev and prev.stop_step else -1
        out: list[Action] = []
        if prev and prev.state == "paused" and prev.via == "tree" and done < 0:
            out.append(Action(job.job_id, "resume"))  # a stopped process cannot handle its stop
        for step in ("asked", "terminated", "killed")[done + 1 : steps[new.stop_step or "asked"] + 1]:
            if step == "asked":
                out.append(Action(job.job_id, "control", state="stop", duty=0.0, reason=reason))
            else:
                out.append(Action(job.job_id, "terminate" if step == "terminated" else "kill", reason=reason))
        return out
    if new.state == "held":
        return []
    if before == "held":
        # admitted, or first seen already running (after a daemon restart).  The document
        # says paused only when the job pauses itself: one paused from outside must find
        # "run" there once it is continued
        control_paused = new.state == "paused" and new.via == "control"
        out = [Action(job.job_id, "control", state="paused" if control_paused else "run", duty=new.duty, reason=reason)]
        if new.state == "paused" and new.via == "tree":
            out.append(Action(job.job_id, "pause", reason=reason))
        return out
    if new.state == "paused":
        if before == "run":
            if new.via == "tree":
                return [Action(job.job_id, "pause", reason=reason)]
            return [Action(job.job_id, "control", state="paused", duty=0.0, reason=reason)]
        return [Action(job.job_id, "pause", reason=reason)] if new.via == "tree" else []
    # new.state == "run"
    if before == "paused" and prev is not None:
        if prev.via == "tree":
            if job.cooperative_pause:  # it may have been told to pause first: its document says run again
                return [
                    Action(job.job_id, "resume", reason=reason),
                    Action(job.job_id, "control", state="run", duty=new.duty, reason=reason),
                ]
            return [Action(job.job_id, "resume", reason=reason)]
        return [Action(job.job_id, "control", state="run", duty=new.duty, reason=reason)]
    if prev is not None and prev.duty != new.duty:
        return [Action(job.job_id, "control", state="run", duty=new.duty, reason=reason)]
    return []


def change_events(job: JobObs, prev: JobVerdict | None, new: JobVerdict, grace_s: float = 0.0) -> list[TimelineEvent]:
    codes_ = [r.code for r in new.reasons]
    data = {"job": job.job_id, "name": job.name, "reasons": codes_}
    before = prev.state if prev else None
    if new.state == "stopping" and before == "stopping" and prev is not None and new.stop_step != prev.stop_step:
        # each escalation of a stop is news: the last one says the job ignored being asked
        if new.stop_step == "terminated":
            text = f"job {job.name} is told to end its processes (terminate)"
        else:
            text = (
                f"job {job.name} was still running {grace_s:g}s after it was told to end "
                "(stop_grace_s): its processes are killed"
            )
        return [TimelineEvent(codes.JOB_STOPPED, job.job_id, text, {**data, "step": new.stop_step, "grace_s": grace_s})]
    if before == new.state:
        return []
    why = f": {new.reasons[0].message}" if new.reasons else ""
    if new.state == "held":
        return [TimelineEvent(codes.JOB_HELD, job.job_id, f"job {job.name} waits{why}", data)]
    if new.state == "stopping":
        return [
            TimelineEvent(
                codes.JOB_STOPPED,
                job.job_id,
                f"job {job.name} is being stopped{why}",
                {**data, "step": new.stop_step, "grace_s": grace_s},
            )
        ]
    if new.state == "paused":
        return [
            TimelineEvent(
                codes.JOB_PAUSED, job.job_id, f"job {job.name} paused ({new.via}){why}", {**data, "via": new.via}
            )
        ]
    if before in (None, "held") and not job.started:
        return [TimelineEvent(codes.JOB_ADMITTED, job.job_id, f"job {job.name} admitted at duty {new.duty:g}", data)]
    if before == "paused":
        return [TimelineEvent(codes.JOB_RESUMED, job.job_id, f"job {job.name} resumed", data)]
    return []
