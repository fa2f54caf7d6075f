"""What holds fleet work back: each rule's holds (its phases, GPU share, progress, priority,
exclusive use) and the node's own (faults, unreadable readers, invalid rule files).

Pure, as the decision that weighs them: :func:`arbiter.engine.decide.decide` gathers these
holds per job, and the reflex reads a phase the same way (:func:`effective_phase`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arbiter.engine import codes
from arbiter.engine.types import (
    JobObs,
    Observation,
    Phase,
    Policy,
    Reason,
    RuleObs,
    RulePolicy,
    RuleState,
    Scope,
    SourceObs,
    evolve,
)


@dataclass(frozen=True)
class Hold:
    scope: Scope
    reason: Reason
    soon: bool = False  # a phase about to begin: no new starts, cooperative jobs pause
    #: "all" jobs in scope, or under the governor only those that "cannot_throttle" (they wait
    #: beside the protected program) or those that "can_throttle" (their budget is 0 now)
    applies: str = "all"
    #: a paired run of this rule decides for the work it covers, past this hold
    run_waives: str | None = None
    #: under the governor, the remedy for work that may not run under the budget (its name is
    #: not trusted with a duty): without the budget's way out, which is not this job's
    remedy_unbudgeted: str | None = None

    def binds(self, job: JobObs, can_throttle: bool) -> bool:
        if not in_scope(self.scope, job):
            return False
        return self.applies == "all" or (self.applies == "can_throttle") == can_throttle


def in_scope(scope: Scope, job: JobObs) -> bool:
    if scope == "gpu":
        return job.uses_gpu
    if scope == "cpu":
        return not job.uses_gpu
    return True


def effective_phase(obs: SourceObs, running: bool, faulty: bool) -> tuple[Phase, Reason | None]:
    """A phase binds only while its program runs; one that cannot be read counts as on."""
    if faulty:
        return "on", None
    if not running:
        return "off", None
    if not obs.readable:
        return "on", _unreadable_reason("a phase source", obs, "its phase counts as on")
    return obs.phase or "off", None


def _unreadable_reason(what: str, obs: SourceObs, consequence: str) -> Reason:
    if obs.needs_helper:
        return Reason(
            codes.PROTECTION_SOURCE_NEEDS_HELPER,
            f"{what} cannot be read by the daemon and no session helper reports it ({obs.why}), so {consequence}",
            "run `arbiter helper` in the login session of the user who owns the file",
        )
    return Reason(
        codes.PROTECTION_SOURCE_UNREADABLE,
        f"{what} cannot be read ({obs.why}), so {consequence}",
        "fix the source's path or permissions (`arbiter check` validates the rule; `arbiter status` shows the source)",
    )


def progress_harm(obs: SourceObs | None, running: bool) -> Reason | None:
    """While its program runs, a progress source that cannot be read counts as harm."""
    if not running:
        return None
    obs = obs or SourceObs(readable=False, why="not read yet")
    if obs.readable:
        return None
    return _unreadable_reason("its progress source", obs, "it counts as harm and GPU work waits")


def rule_holds(
    policy: Policy,
    rp: RulePolicy,
    ro: RuleObs,
    rs: RuleState,
    phases: tuple[Phase, ...],
    phase_reasons: list[Reason],
    governed: bool = False,
    reader_ok: bool = True,
) -> list[Hold]:
    """What the rule holds back.  ``governed``: a valid certificate lets cooperative GPU
    work run beside it under the budget, so only work that cannot throttle waits.
    ``reader_ok``: some reader read GPU time on this observation."""
    holds: list[Hold] = []
    rid = rp.rule_id
    if rp.protected and rs.using_gpu and policy.gpu_jobs in ("when_no_gpu_protected", "certified"):
        # a fault is named as itself, with what fixes it: waiting for the program would not
        code, remedy = codes.PROTECTED_GPU_BUSY, ""
        evidence: dict[str, Any]
        if ro.faults:
            evidence = {"rule": rid, "faults": list(ro.faults)}
            why = f"a plugin for it failed ({'; '.join(ro.faults)}), which counts as using the GPU"
            code = codes.PLUGIN_FAILED
            remedy = (
                "fix what failed (`arbiter doctor`; `arbiter timeline --code PLUGIN_FAILED` says since when), "
                "or block a broken plugin with disable_plugins in arbiter.yaml; work runs again once it answers"
            )
        elif ro.gpu_share is None and ro.running:
            evidence = {"rule": rid, "why": ro.gpu_why}
            why = f"its GPU time cannot be read ({ro.gpu_why or 'no reader reads it'}), which counts as using it"
            if not reader_ok:
                code = codes.GPU_TIME_UNREADABLE
                remedy = (
                    "`arbiter doctor` says what each reader read; fix the reader, or name one that works "
                    "under readers: in arbiter.yaml; work runs again once GPU time reads"
                )
        elif ro.running:
            evidence = {"rule": rid, "gpu_share": round(ro.gpu_share or 0.0, 4), "threshold": policy.busy_threshold}
            why = (
                f"it uses {100 * (ro.gpu_share or 0.0):.0f}% of the GPU (threshold {100 * policy.busy_threshold:.0f}%)"
            )
        else:
            evidence = {"rule": rid, "release_after_s": policy.release_after_s}
            why = f"it stopped using the GPU less than {policy.release_after_s:g}s ago"
        remedy = remedy or (
            f"nothing to do: it runs once {rid!r} stays below the threshold for {policy.release_after_s:g}s "
            "(gpu_busy_threshold, gpu_release_after_s in arbiter.yaml)"
        )
        holds.append(
            Hold(
                "gpu",
                Reason(
                    code,
                    f"protected program {rid!r} uses the GPU: {why}",
                    remedy
                    + ("; work that declares cooperative_throttle runs beside it under the budget" if governed else ""),
                    evidence,
                ),
                applies="cannot_throttle" if governed else "all",
                run_waives=rid,
                remedy_unbudgeted=remedy if governed else None,
            )
        )
        if policy.gpu_jobs == "certified" and not governed:
            holds.append(
                Hold(
                    "gpu",
                    Reason(
                        codes.GPU_NOT_CERTIFIED,
                        f"no valid certificate lets GPU work run beside {rid!r}",
                        f"arbiter ab sweep --rule {rid}",
                        {"rule": rid},
                    ),
                    run_waives=rid,
                )
            )
    if rp.pause_fleet and ro.running:
        holds.append(
            Hold(
                rp.pause_fleet,
                Reason(
                    codes.RULE_PAUSE_FLEET,
                    f"{rid!r} runs and its rule pauses {rp.pause_fleet} fleet work while it runs",
                    f"wait for {rid!r} to exit, or change pause_fleet in its rule file",
                    {"rule": rid, "scope": rp.pause_fleet},
                ),
            )
        )
    for i, (dp, phase) in enumerate(zip(rp.during, phases, strict=False)):
        if phase == "off":
            continue
        tags = f" [{', '.join(dp.tags)}]" if dp.tags else ""
        code = codes.PROTECTION_PHASE_ON if phase == "on" else codes.PROTECTION_PHASE_SOON
        state = "is on" if phase == "on" else "is about to begin"
        holds.append(
            Hold(
                dp.scope,
                Reason(
                    code,
                    f"a phase of {rid!r}{tags} {state}; {dp.scope} fleet work waits",
                    "it resumes when the phase ends",
                    {"rule": rid, "during": i, "scope": dp.scope, "phase": phase},
                ),
                soon=phase == "soon",
            )
        )
    holds.extend(Hold("gpu", r) for r in phase_reasons)
    if rp.protected and rp.progress and policy.gpu_jobs != "always":
        harm = progress_harm(ro.progress, ro.running)
        if harm is not None:
            holds.append(
                Hold("gpu", evolve(harm, message=f"{rid!r}: {harm.message}", evidence={"rule": rid, "progress": True}))
            )
    return holds


def node_holds(obs: Observation, policy: Policy) -> list[Hold]:
    holds = []
    if obs.invalid_files:
        holds.append(
            Hold(
                "gpu",
                Reason(
                    codes.CONFIG_REJECTED,
                    f"rule file(s) never valid: {', '.join(obs.invalid_files)}; until one reads, which program it "
                    "protects cannot be known, and it may be any that uses the GPU now, so all GPU work waits",
                    f"fix what `arbiter check {' '.join(obs.invalid_files)}` reports, or move the file out of the "
                    "tenants dirs until it is finished",
                    {"files": list(obs.invalid_files)},
                ),
            )
        )
    if policy.gpu_jobs == "never":
        holds.append(
            Hold(
                "gpu",
                Reason(
                    codes.GPU_JOBS_NEVER,
                    "this node runs no GPU fleet work (gpu_jobs: never)",
                    "set gpu_jobs in arbiter.yaml",
                ),
            )
        )
    return holds
