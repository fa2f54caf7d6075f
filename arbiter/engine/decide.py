"""The decision: a pure function of (observation, previous state, policy, now).

It says, for every job, whether it may run (and at what duty), waits, is paused (and how)
or is being stopped, each with its reasons; which actions that changes; and what goes on
the timeline.  Nothing here reads a clock, a file or a process.

What holds fleet work back, per rule and for the node, is in :mod:`arbiter.engine.holds`;
what stands alone has a module of its own (compliance, governor, handoff, reacquire,
eviction, the paired run and what it says of each job).  Each job's verdict weighs them
together here, which is why this module runs past 400 lines: a job's verdict comes from its
holds, trust, budget, run and handoff pause at once.  What a change of verdict does and
tells is in :mod:`arbiter.engine.jobchange`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from arbiter.engine import codes
from arbiter.engine.abjob import RunSays, run_obs, run_says
from arbiter.engine.abrun import advance
from arbiter.engine.compliance import Verdict as Compliance
from arbiter.engine.compliance import check as check_compliance
from arbiter.engine.compliance import prune as prune_trust
from arbiter.engine.compliance import trust_key, untrusted_reason
from arbiter.engine.evict import PROTECTION, record
from arbiter.engine.evict import ran_again as evict_ran_again
from arbiter.engine.evict import step as evict_step
from arbiter.engine.governor import ceiling, stand_down
from arbiter.engine.governor import step as governor_step
from arbiter.engine.handoff import JOB_PREFIX, TenantObs, job_tenant
from arbiter.engine.handoff import step as handoff_step
from arbiter.engine.holds import Hold, effective_phase, node_holds, rule_holds
from arbiter.engine.jobchange import change_actions, change_events
from arbiter.engine.types import (
    Action,
    Decision,
    EngineState,
    GovernorState,
    HeldJob,
    JobCompliance,
    JobObs,
    JobVerdict,
    NameTrust,
    Observation,
    Phase,
    Policy,
    Reason,
    RuleObs,
    RuleState,
    RuleVerdict,
    SourceObs,
    TimelineEvent,
    evolve,
)
from arbiter.engine.usage import gpu_usage


def _can_throttle(job: JobObs) -> bool:
    """It uses the GPU and holds a duty it is given (the SDK's Duty, or a supervisor)."""
    return job.uses_gpu and "cooperative_throttle" in job.capabilities


def _stop_step(job: JobObs, since: float, grace: float, now: float) -> str:
    elapsed = now - since
    # a job that cannot read its control document is terminated at once, then killed after the grace
    first = grace if job.reads_control else 0.0
    if elapsed >= first + grace:
        return "killed"
    if elapsed >= first:
        return "terminated"
    return "asked"


def _job_verdict(
    job: JobObs,
    holds: list[Hold],
    exclusive_blockers: list[Reason],
    policy: Policy,
    now: float,
    prev: JobVerdict | None,
    checked: Compliance,
    can_throttle: bool = False,
    share: float | None = None,
    run: RunSays | None = None,
    vram_for: Reason | None = None,
) -> JobVerdict:
    """``share``: the duty the governor's budget gives each job that can throttle; ``run``:
    what a paired run in progress says of this job."""
    if run is not None and run.evict_since is not None and job.started and job.stop_requested_at is None:
        assert run.reason is not None
        step = _stop_step(job, run.evict_since, policy.stop_grace_s, now)
        return JobVerdict(job.job_id, "stopping", duty=0.0, stop_step=step, reasons=(run.reason,))  # type: ignore[arg-type]
    if run is not None and run.arm is not None:
        holds = [h for h in holds if h.run_waives != run.rule_id]
    if job.stop_requested_at is not None or checked.stop is not None:
        if job.stop_requested_at is not None:
            since = job.stop_requested_at
            reason = Reason(codes.JOB_STOPPED, "its owner asked it to stop", "start it again with `arbiter job run`")
        else:
            assert checked.stop is not None and checked.state.stopped_at is not None
            since, reason = checked.state.stopped_at, checked.stop
        step = _stop_step(job, since, policy.stop_grace_s, now)
        return JobVerdict(job.job_id, "stopping", duty=0.0, stop_step=step, reasons=(reason,))  # type: ignore[arg-type]
    binding = [h for h in holds if not h.soon and h.binds(job, can_throttle)]
    pausing = [h.reason for h in binding]
    if job.uses_gpu and checked.trust.untrusted(now):
        # its name gets no duty: it waits where it would run under one (its manifest caps it,
        # or a governor would give it a budget), and that comes first, as the reason that lasts
        unbudgeted = [h for h in binding if h.remedy_unbudgeted is not None]
        if job.max_duty < 1.0 or (_can_throttle(job) and unbudgeted):
            pausing = [
                untrusted_reason(job.name, checked.trust, now, governed=bool(unbudgeted)),
                *(
                    evolve(h.reason, remedy=h.remedy_unbudgeted) if h.remedy_unbudgeted is not None else h.reason
                    for h in binding
                ),
            ]
    pausing.extend(checked.holds)
    soon = [h.reason for h in holds if h.soon and h.binds(job, can_throttle)]
    if job.user_hold:
        pausing.append(Reason(codes.JOB_HELD_BY_USER, "its owner paused it", f"arbiter job resume {job.job_id}"))
    if job.use == "exclusive":
        pausing.extend(exclusive_blockers)
    elif job.uses_gpu:
        pausing.extend(r for r in exclusive_blockers if r.evidence.get("exclusive_job"))
    if run is not None and run.reason is not None:
        pausing.append(run.reason)
    if vram_for is not None:
        pausing.append(vram_for)
    duty = job.max_duty if job.uses_gpu else 1.0
    if can_throttle and share is not None:
        duty = min(duty, round(share, 4))
    if run is not None and run.arm == "on" and run.duty is not None and _can_throttle(job):
        duty = min(duty, run.duty)  # another rule's budget still caps it
    if not job.started:
        reasons = tuple(pausing + soon)
        return JobVerdict(job.job_id, "held" if reasons else "run", duty=0.0 if reasons else duty, reasons=reasons)
    if pausing:
        via = "control" if job.cooperative_pause else "tree"
        if prev is not None and prev.state == "paused" and prev.via:
            via = prev.via  # resume the way it was paused
        if checked.holds or checked.from_outside:
            via = "tree"  # it did not hold its duty, or went on after being told to pause
        return JobVerdict(job.job_id, "paused", duty=0.0, via=via, reasons=tuple(pausing))  # type: ignore[arg-type]
    if soon and job.cooperative_pause:
        return JobVerdict(job.job_id, "paused", duty=0.0, via="control", reasons=tuple(soon))
    return JobVerdict(job.job_id, "run", duty=duty, reasons=tuple(soon))


def _tenants(policy: Policy, obs: Observation, states: dict[str, RuleState]) -> list[TenantObs]:
    """Every running tenant as the VRAM handoff sees it: busy from its probe (unknown when
    the probe cannot be read), or while it uses the GPU where it has none."""
    out = []
    for rid, rp in policy.rules.items():
        ro = obs.rules.get(rid)
        if ro is None or not ro.running:
            continue
        if rp.busy_probe:
            busy = ro.busy.busy if ro.busy is not None and ro.busy.readable else None
        else:
            busy = states[rid].using_gpu
        out.append(
            TenantObs(
                rid,
                rp.priority,
                busy,
                ro.vram_bytes,
                rp.reclaimable,
                rp.needs_vram_bytes,
                rp.idle_release_after_s,
                rp.release_timeout_s,
                rp.confirm,
                rp.reacquire_after_s if rp.reacquire else None,
                rp.reacquire_timeout_s,
                rp.reacquire_confirm,
                when_busy=rp.release_when_busy,
                drain_timeout_s=rp.drain_timeout_s,
            )
        )
    if policy.pause_frees_vram:
        # below every tenant; busy, so never released for being idle; a cooperative job pauses
        # itself, which frees nothing, so only one paused from outside counts
        below = min((rp.priority for rp in policy.rules.values()), default=0) - 1
        for job in obs.jobs.values():
            if job.started and job.uses_gpu and job.stop_requested_at is None and not job.cooperative_pause:
                out.append(
                    TenantObs(
                        job_tenant(job.job_id),
                        below,
                        True,
                        job.vram_bytes,
                        True,
                        None,
                        0.0,
                        JOB_RELEASE_TIMEOUT_S,
                        True,
                        job=True,
                    )
                )
    return out


#: how long a job's pause may take to give its VRAM back (a checkpoint copies it to host memory)
JOB_RELEASE_TIMEOUT_S = 60.0


def _vram_pause(job: JobObs, pauses: Mapping[str, str]) -> Reason | None:
    """Why a job is paused for another tenant's VRAM, if it is."""
    demander = pauses.get(job_tenant(job.job_id))
    if demander is None:
        return None
    return Reason(
        codes.JOB_PAUSED_FOR_VRAM,
        f"paused so that its VRAM goes to {demander!r}, which is short of it",
        f"it resumes once {demander!r} is idle or ends; a pause that frees VRAM checkpoints its device memory",
        {"tenant": demander},
    )


def decide(obs: Observation, prev: EngineState, policy: Policy, now: float) -> Decision:
    events: list[TimelineEvent] = []
    run = prev.ab if prev.ab is not None and prev.ab.running else None
    rule_states: dict[str, RuleState] = {}
    rule_verdicts: dict[str, RuleVerdict] = {}
    holds = node_holds(obs, policy)
    any_tenant_on_gpu: list[str] = []

    candidates = [
        j
        for j in obs.jobs.values()
        if _can_throttle(j)
        and j.stop_requested_at is None
        and not prev.trust.get(trust_key(j), NameTrust()).untrusted(now)
    ]
    # the ceiling covers the work running now; a job not started yet gets a duty only where
    # every governed rule's certificates cover it too (else it waits like work that cannot throttle)
    running_names = sorted({j.name for j in candidates if j.started})
    throttlers = list(candidates)
    governors: dict[str, GovernorState] = {}
    budgets: list[float] = []
    for rid, rp in policy.rules.items():
        ro = obs.rules.get(rid) or RuleObs(rid)
        before = prev.rules.get(rid, RuleState())
        rs = gpu_usage(before, ro, policy.busy_threshold, policy.release_after_s, now)
        governed = False
        gs_before = prev.governors.get(rid, GovernorState())
        measured = run is not None and run.spec.rule_id == rid  # a paired run alone decides
        if policy.gpu_jobs == "certified" and rp.protected and rs.using_gpu and not ro.faults and not measured:
            top = ceiling(obs.certificates, rid, running_names)
            if top > 0:
                governed = True
                throttlers = [j for j in throttlers if j.started or ceiling(obs.certificates, rid, [j.name]) > 0]
                gstep = governor_step(
                    rid, gs_before, ro.progress, top, rp.max_slowdown, obs.memory_available, policy.governor, now
                )
                governors[rid] = gstep.state
                events.extend(gstep.events)
                if gstep.hold is not None:
                    holds.append(Hold("gpu", gstep.hold, applies="can_throttle"))
                budgets.append(0.0 if gstep.hold is not None else gstep.state.budget)
        if not governed and gs_before != GovernorState():
            governors[rid] = stand_down(gs_before)
        if rp.protected and rs.using_gpu != before.using_gpu:
            code = codes.PROTECTION_GPU_ON if rs.using_gpu else codes.PROTECTION_GPU_OFF
            share = ro.gpu_share
            text = "uses the GPU" if rs.using_gpu else "no longer uses the GPU"
            events.append(TimelineEvent(code, rid, f"protected program {rid!r} {text}", {"gpu_share": share}))
        if rs.using_gpu:
            any_tenant_on_gpu.append(rid)

        phases: list[Phase] = []
        phase_reasons: list[Reason] = []
        for i, _ in enumerate(rp.during):
            po = ro.phases[i] if i < len(ro.phases) else SourceObs(readable=False, why="not read yet")
            phase, why = effective_phase(po, ro.running, bool(ro.faults))
            phases.append(phase)
            if why is not None:
                phase_reasons.append(
                    evolve(why, message=f"{rid!r}: {why.message}", evidence={"rule": rid, "during": i})
                )
            was = before.phases[i] if i < len(before.phases) else "off"
            if phase != was:
                code = {
                    "on": codes.PROTECTION_PHASE_ON,
                    "off": codes.PROTECTION_PHASE_OFF,
                    "soon": codes.PROTECTION_PHASE_SOON,
                }[phase]
                data: dict[str, Any] = {"during": i, "phase": phase, "seen_by": po.seen_by, "changed_at": po.changed_at}
                if why is not None:
                    data["why"] = why.code
                events.append(TimelineEvent(code, rid, f"{rid!r} phase {phase} (seen by {po.seen_by})", data))
        rs = evolve(rs, phases=tuple(phases))
        rule_states[rid] = rs
        rule_hold_list = rule_holds(policy, rp, ro, rs, tuple(phases), phase_reasons, governed, obs.reader_ok)
        holds.extend(rule_hold_list)
        # how long each protection holds fleet work, for evict_after_s: auto
        rule_states[rid] = record(rs, any(h.reason.code in PROTECTION and not h.soon for h in rule_hold_list), now)
        rule_verdicts[rid] = RuleVerdict(
            rid,
            ro.running,
            rp.protected,
            rs.using_gpu,
            rs.using_since,
            ro.gpu_share,
            tuple(phases),
            tuple(h.reason for h in rule_hold_list),
        )

    faulty = bool(obs.node_faults)  # who runs is not known: no handoff or profile change on its word
    handoff = handoff_step(_tenants(policy, obs, rule_states), prev.vram, obs.vram_free_bytes, now, faulty)
    # a job's entries are about the job: the timeline lists them under its id
    events.extend(
        evolve(e, subject=e.subject.removeprefix(JOB_PREFIX)) if e.subject.startswith(JOB_PREFIX) else e
        for e in handoff.events
    )
    for rid, note in handoff.notes.items():
        rule_verdicts[rid] = evolve(rule_verdicts[rid], notes=(note,))
    working = (
        prev.profiles
        if faulty
        else frozenset(
            rid
            for rid, rp in policy.rules.items()
            if rp.profile and rule_states[rid].using_gpu and (obs.rules.get(rid) or RuleObs(rid)).running
        )
    )
    ab = advance(run, run_obs(run, obs, rule_verdicts.get(run.spec.rule_id), policy, prev, now)) if run else None
    if ab is not None:
        events.extend(ab.events)
        run = ab.state if ab.state is not None and ab.state.running else None
    throttler_ids = {j.job_id for j in throttlers}
    # running jobs keep their place; pending ones are admitted in the order they came
    ordered = sorted(obs.jobs.values(), key=lambda j: (not j.started, j.submitted_at, j.job_id))
    verdicts: dict[str, JobVerdict] = {}
    actions: list[Action] = []
    compliance: dict[str, JobCompliance] = {}
    trust: dict[str, NameTrust] = dict(prev.trust)
    held: dict[str, HeldJob] = {}
    spans = {rid: rs.held_spans for rid, rs in rule_states.items()}
    exclusive_running: str | None = None
    gpu_jobs_running: list[str] = []
    for job in ordered:
        blockers: list[Reason] = []
        if exclusive_running is not None:
            blockers.append(
                Reason(
                    codes.GPU_EXCLUSIVE_WAIT,
                    f"job {exclusive_running} has the GPU to itself (gpu.use: exclusive)",
                    "it runs when that job ends",
                    {"exclusive_job": exclusive_running},
                )
            )
        if job.use == "exclusive":
            users = [f"tenant {r}" for r in any_tenant_on_gpu] + [f"job {j}" for j in gpu_jobs_running]
            if users:
                blockers.append(
                    Reason(
                        codes.GPU_EXCLUSIVE_WAIT,
                        f"it needs the GPU to itself and {', '.join(users)} use(s) it",
                        "it runs once nothing else uses the GPU",
                        {"users": users},
                    )
                )
        prev_v, prev_held = prev.jobs.get(job.job_id), prev.held.get(job.job_id)
        if prev_held is not None and evict_ran_again(job, prev_held):
            prev_v = prev_held = None  # placed back here after its eviction: a job seen anew
        running_at_duty = prev_v is not None and prev_v.state == "run" and job.uses_gpu and prev_v.duty < 1.0
        checked = check_compliance(
            job,
            prev_v.duty if running_at_duty and prev_v else None,
            job.uses_gpu and job.max_duty < 1.0,
            bool(prev_v and prev_v.state == "paused" and prev_v.via == "control"),
            prev.compliance.get(job.job_id, JobCompliance()),
            trust.get(trust_key(job), NameTrust()),
            policy.compliance,
            policy.busy_threshold,
            now,
        )
        compliance[job.job_id] = checked.state
        trust[trust_key(job)] = checked.trust
        events.extend(checked.events)
        share = min(budgets) / len(throttlers) if budgets and throttlers else None
        says = run_says(run, job) if run is not None else None
        verdict = _job_verdict(
            job,
            holds,
            blockers,
            policy,
            now,
            prev_v,
            checked,
            job.job_id in throttler_ids,
            share,
            says,
            _vram_pause(job, handoff.job_pauses),
        )
        held_job = evict_step(
            job,
            verdict,
            prev_held,
            policy.evict_after_s,
            now,
            spans,
            policy.evict_cost_s,
        )
        if held_job is not None:
            held[job.job_id] = held_job
            if held_job.evicted_at is not None and held_job.reason is not None:
                step = _stop_step(job, held_job.evicted_at, policy.stop_grace_s, now)
                verdict = JobVerdict(job.job_id, "stopping", duty=0.0, stop_step=step, reasons=(held_job.reason,))  # type: ignore[arg-type]
        if verdict.state == "paused" and verdict.via == "control" and not (prev_v and prev_v.state == "paused"):
            compliance[job.job_id] = evolve(checked.state, told_at=now)  # told now: samples count from here
        asked = verdict.duty if verdict.state == "run" else None
        if asked != compliance[job.job_id].asked:  # a new duty: samples from before it say nothing of it
            compliance[job.job_id] = evolve(compliance[job.job_id], asked=asked, asked_since=now, over=0)
        verdicts[job.job_id] = verdict
        if verdict.state == "run" and job.uses_gpu:
            gpu_jobs_running.append(job.job_id)
            if job.use == "exclusive":
                exclusive_running = job.job_id
        actions.extend(change_actions(job, prev_v, verdict))
        events.extend(change_events(job, prev_v, verdict, policy.stop_grace_s))

    notices = tuple(h.reason for h in node_holds(obs, policy))
    active = frozenset(n.code for n in notices)
    for code in sorted(active - prev.notices):
        reason = next(n for n in notices if n.code == code)
        events.append(TimelineEvent(code, "node", reason.message, dict(reason.evidence)))

    trust = {
        name: t
        for name, t in ((n, prune_trust(t, policy.compliance, now)) for n, t in trust.items())
        if t.strikes or t.untrusted(now)
    }
    state = EngineState(
        rules=rule_states,
        jobs=verdicts,
        notices=active,
        compliance=compliance,
        trust=trust,
        governors=governors,
        ab=ab.state if ab is not None else prev.ab,
        vram=handoff.states,
        profiles=working,
        held=held,
    )
    newcomer = JobObs("", "", -1)  # a plain GPU job asking to start now
    admits = run is None and not any(h.binds(newcomer, False) for h in holds)
    return Decision(
        state,
        verdicts,
        rule_verdicts,
        tuple(actions),
        tuple(events),
        notices,
        admits,
        ab.ended if ab is not None else (),
        handoff.releases,
        tuple(sorted(working - prev.profiles)),
        tuple(sorted(prev.profiles - working)),
        () if admits else tuple(h.reason for h in holds if h.binds(newcomer, False)),
    )
