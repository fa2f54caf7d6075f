"""Status and explain answers, built from the last published snapshot (no locks, no I/O),
shared by the socket and the HTTP listener."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, TypedDict

from arbiter import __version__
from arbiter.daemon.observe import clock_jump_message
from arbiter.daemon.sharehistory import share_view
from arbiter.engine import codes
from arbiter.engine.abrecord import effect_changed_note
from arbiter.engine.types import JobVerdict

if TYPE_CHECKING:
    from arbiter.daemon.parts import Parts


class UnknownSubject(LookupError):
    pass


def _job_item(daemon: Parts, record: Any, verdict: JobVerdict | None) -> dict[str, Any]:
    manifest = record.manifest
    gpu = manifest.get("gpu", {})
    view = daemon.snapshot.view
    refs = view.job_processes.get(record.id, ()) if view else ()
    busy = view.job_busy.get(record.id) if view else None
    report = view.job_reports.get(record.id) if view else None
    started = record.root_pid is not None
    return {
        "kind": "job",
        "id": record.id,
        "name": record.name,
        "owner_uid": record.owner_uid,
        "state": verdict.state if verdict else ("held" if not started else "unknown"),
        "started": started,
        "duty": verdict.duty if verdict else 0.0,
        "via": verdict.via if verdict else None,
        "use": gpu.get("use", "shared"),
        "capabilities": manifest.get("capabilities", []),
        "pids": [r.pid for r in refs] or ([record.root_pid] if started else []),
        "measured_busy": None if busy is None else round(busy, 4),
        # what it says of itself in its events file: shown, never believed over the measure
        "reported": report.to_dict() if report else {},
        "cmd": record.cmd,
        "submitted": record.submitted,
        "reasons": [r.to_dict() for r in verdict.reasons] if verdict else [],
        # what its pause stops and frees, and what it leaves held (its VRAM), as the translator says
        "pause_effect": daemon.actuator.pause_effect(record.id) if verdict and verdict.state == "paused" else "",
        # how long protection has kept it paused, and when that stops it (evict_after_s)
        "protection_pause": _protection_pause(daemon, record.id),
        # what the daemon is trying and failing to do to it (a pause the translator refuses)
        "problems": [
            {
                "code": codes.PLUGIN_FAILED,
                "message": what,
                "evidence": {"job": record.id},
                "remedy": "`arbiter doctor` shows the translators; fix the one named, or choose another under "
                "translators: in arbiter.yaml (it is tried again on every decision)",
            }
            for jid, what in sorted(daemon.decider.failures.current)
            if jid == record.id
        ],
    }


def _protection_pause(daemon: Parts, job_id: str) -> dict[str, Any] | None:
    held = daemon.decider.engine_state.held.get(job_id)
    if held is None or held.evicted_at is not None:
        return None
    now, policy = time.monotonic(), daemon.decider.policy.evict_after_s
    # a pause restored from the state database has its limit from the next decision on
    after = held.after_s if held.after_s is not None or policy is None or policy == "auto" else policy
    return {
        "for_s": round(now - held.since, 1),
        "evict_after_s": after,
        "evict_in_s": None if after is None else round(max(0.0, held.since + after - now), 1),
        # where evict_after_s is auto: why that wait, from the rule's latest protections
        "evict_basis": held.basis,
    }


def _rule_item(daemon: Parts, rid: str) -> dict[str, Any]:
    live = daemon.rulebook.live.get(rid)
    snap = daemon.snapshot
    verdict = snap.decision.rules.get(rid) if snap.decision else None
    obs = snap.view.rules.get(rid) if snap.view else None
    now = time.monotonic()
    sources = daemon.intake.book.view(rid, now)
    running = bool(obs and obs.running)
    return {
        "kind": "rule",
        "id": rid,
        "file": live.path if live else "",
        "tenant_kind": live.rule.kind if live else "",
        "priority": live.rule.priority if live else 0,
        "protected": bool(live and live.rule.protected),
        "immediate": bool(live and live.rule.immediate),
        "running": running,
        "pids": sorted(obs.pids) if obs else [],
        # its processes another rule selected first: inside its tree, they go with it
        "from_trees": {
            str(pid): first for pid, (first, owner) in daemon.ticker.observer.claimer.moved.items() if owner == rid
        },
        "gpu_share": None if not obs or obs.gpu_share is None else round(obs.gpu_share, 4),
        "gpu_why": obs.gpu_why if obs else "",
        "using_gpu": bool(verdict and verdict.using_gpu),
        "using_for_s": round(now - verdict.using_since, 1) if verdict and verdict.using_since else None,
        "phases": list(verdict.phases) if verdict else [],
        "sources": sources,
        "faults": list(live.faults) if live else [],
        "holds": [r.to_dict() for r in verdict.holds] if verdict else [],
        "notes": ([r.to_dict() for r in verdict.notes] if verdict else [])
        + effect_changed_note(daemon.decider.engine_state.ab, rid),
        "vram_bytes": obs.vram_bytes if obs else None,
        "reclaimable": bool(live and live.rule.release),
        "releasing": _releasing(daemon, rid),
        "profile_applied": rid in daemon.tenants.applied,
        "problems": [dict(p) for p in [daemon.tenants.release_failed.get(rid)] if p]
        + ([] if running else misses_its_program(rid, sources)),
    }


def misses_its_program(rid: str, sources: list[dict[str, Any]]) -> list[dict[str, str]]:
    """A rule whose source advances while no process matches it most likely misses its
    program (a ``match:`` written for another launch): said, with how to see what it misses."""
    out = []
    for src in sources:
        if src["readable"] and src.get("rate"):
            out.append(
                {
                    "code": codes.RULE_MATCHES_NOTHING,
                    "message": (
                        f"its source {src['slot']} ({src['kind']}) advances at {src['rate']:g}/s while no process "
                        f"matches its match: block, so '{rid}' counts as not running and protects nothing"
                    ),
                    "remedy": f"`arbiter rules {rid}` shows what its match: selects and the near misses, "
                    "with the field that missed; change that field in its rule file",
                }
            )
    return out


def _releasing(daemon: Parts, rid: str) -> dict[str, Any] | None:
    st = daemon.decider.engine_state.vram.get(rid)
    if st is None or st.requested_at is None:
        return None
    return {"for_s": round(time.monotonic() - st.requested_at, 2), "held_at_request": st.held_at_request, "why": st.why}


def vram_view(daemon: Parts, rules: list[dict[str, Any]]) -> dict[str, Any]:
    """The device's VRAM, what each tenant and the jobs hold, and what no rule claims."""
    view = daemon.snapshot.view
    vram = dict(view.vram) if view else {}
    total, free = vram.get("total"), vram.get("free")
    tenants = {r["id"]: r["vram_bytes"] for r in rules if r["running"]}
    attributed = sum(v or 0 for v in tenants.values()) + (vram.get("jobs") or 0)
    known = all(v is not None for v in tenants.values()) and vram.get("jobs") is not None
    used = None if total is None or free is None or not known else total - free  # a tenant unread: unknown
    return {
        "total_bytes": total,
        "free_bytes": free,
        "jobs_bytes": vram.get("jobs"),
        "tenants": [
            {"id": r["id"], "bytes": r["vram_bytes"], "reclaimable": r["reclaimable"]} for r in rules if r["running"]
        ],
        # held by processes no rule or job claims: no way to reclaim it, but never hidden
        "unmanaged_bytes": None if used is None else max(0, used - attributed),
    }


def state_notices(daemon: Parts) -> list[dict[str, Any]]:
    """The state directory refusing writes (full, read-only): protection goes on, unrecorded."""
    rec, journal = daemon.recorder, daemon.journal
    if rec.failing_since is None and not journal.failures:
        return []
    errors = [e for e in (rec.last_error if rec.failing_since is not None else "", journal.last_error) if e]
    return [
        {
            "code": codes.STATE_WRITE_FAILED,
            "message": (
                f"the state directory {daemon.state_dir} cannot be written ({'; '.join(errors)}): protection goes "
                f"on, but {rec.lost} record(s) (timeline, jobs, paused set) and {journal.failures} pause journal "
                "line(s) are not kept; what was recorded before is kept"
            ),
            "remedy": (
                f"free space on the file system of {daemon.state_dir}, or make it writable again (is it full, or "
                "mounted read-only?); "
                "arbiter writes there again by itself once it can"
            ),
            "evidence": {
                "since": rec.failing_since,
                "failures": rec.failures,
                "lost": rec.lost,
                "journal_failures": journal.failures,
            },
        }
    ]


CLOCK_NOTICE_S = 600.0  # how long explain mentions a clock jump


def clock_notices(daemon: Parts) -> list[dict[str, Any]]:
    jump = daemon.ticker.observer.clock_jump
    if jump is None or time.monotonic() - jump[0] > CLOCK_NOTICE_S:
        return []
    return [
        {
            "code": codes.CLOCK_JUMPED,
            "message": clock_jump_message(jump[1]),
            "remedy": "nothing to do for arbiter; if the clock was wrong, fix the machine's time sync. A "
            "certificate whose age the jump hides does not hold: run `arbiter ab sweep` again",
            "evidence": {"jump_s": round(jump[1], 1), "ago_s": round(time.monotonic() - jump[0], 1)},
        }
    ]


def _costs(c: dict[str, Any]) -> dict[str, Any]:
    return {
        "ticks": c["ticks"],
        "tick_cpu_ms": round(1000 * c["tick_cpu_s"] / c["ticks"], 3) if c["ticks"] else None,
        "decisions": c["decisions"],
        "decide_cpu_ms": round(1000 * c["decide_cpu_s"] / c["decisions"], 3) if c["decisions"] else None,
        "redecisions": c["redecisions"],
    }


def status_view(daemon: Parts) -> dict[str, Any]:
    snap = daemon.snapshot
    decision = snap.decision
    view = snap.view
    verdicts = decision.jobs if decision else {}
    jobs = [_job_item(daemon, r, verdicts.get(r.id)) for r in snap.jobs]
    rules = [_rule_item(daemon, lr.rule.id) for lr in daemon.rulebook.ordered()]
    return {
        "version": __version__,
        "pid": os.getpid(),
        "uptime_s": round(time.time() - daemon.started_wall, 1),
        "config": str(daemon.config_path or ""),
        "state_dir": str(daemon.state_dir),
        "gpu_jobs": daemon.config.gpu_jobs,
        "tick_s": daemon.config.tick_s,
        "decided_at": snap.decided_at,
        "reader": {
            "name": view.reader if view else "",
            "why": view.reader_why if view else "",
            "vram": dict(view.vram) if view else {},
        },
        "processes": view.table_size if view else 0,
        "scan_ms": round(view.scan_s * 1000, 2) if view else None,
        "rules": rules,
        "vram": vram_view(daemon, rules),
        "gpu_share_history": share_view(snap.shares, loaded=dict(daemon.rulebook.live).keys()),
        "jobs": jobs,
        "notices": ([r.to_dict() for r in decision.notices] if decision else [])
        + state_notices(daemon)
        + clock_notices(daemon),
        "invalid_files": list(daemon.rulebook.invalid_files),
        "problems": {f: [str(p) for p in ps] for f, ps in daemon.rulebook.problems.items()},
        "fast_path": daemon.intake.figures(),
        "helpers": daemon.helpers.view(),
        "costs": _costs(daemon.costs()),
        "recorder": {
            "failures": daemon.recorder.failures,
            "last_error": daemon.recorder.last_error,
            "failing_since": daemon.recorder.failing_since,
            "lost": daemon.recorder.lost,
            "journal_failures": daemon.journal.failures,
        },
        "translators": {need: name for need, (name, _) in daemon.actuator.translators.items()},
        # what fleet schedulers are told of this node (a scheduler's node features, say)
        "scheduler_labels": list(daemon.ticker.scheduler_labels),
    }


def explain_view(daemon: Parts, subject: str | None = None) -> dict[str, Any]:
    """Why each job is (not) running; for a subject, that job, job name or tenant, the jobs an
    outside scheduler knows by that id, or the tenant that owns the process of that pid."""
    snap = daemon.snapshot
    verdicts = snap.decision.jobs if snap.decision else {}
    notices = (
        ([r.to_dict() for r in snap.decision.notices] if snap.decision else [])
        + state_notices(daemon)
        + clock_notices(daemon)
    )
    if subject is None:
        items = [_job_item(daemon, r, verdicts.get(r.id)) for r in snap.jobs]
        items += [_rule_item(daemon, lr.rule.id) for lr in daemon.rulebook.ordered()]
        return {"subject": "node", "items": items, "notices": notices}
    records = [r for r in snap.jobs if r.id == subject or r.name == subject] or [
        r for r in snap.jobs if _own_id(r.id) == subject or _own_id(r.id).startswith(subject + ".")
    ]
    if records:
        return {
            "subject": subject,
            "items": [_job_item(daemon, r, verdicts.get(r.id)) for r in records],
            "notices": notices,
        }
    if subject in dict(daemon.rulebook.live):
        item = _rule_item(daemon, subject)
        held = [
            _job_item(daemon, r, verdicts[r.id])
            for r in snap.jobs
            if r.id in verdicts and any(reason.evidence.get("rule") == subject for reason in verdicts[r.id].reasons)
        ]
        return {"subject": subject, "items": [item, *held], "notices": notices}
    owner = _owner_of(daemon, subject)
    if owner is not None:  # a process: the rule that owns it
        return {"subject": subject, "items": [_rule_item(daemon, owner)], "notices": notices}
    known = sorted({r.id for r in snap.jobs} | {r.name for r in snap.jobs} | set(dict(daemon.rulebook.live)))
    raise UnknownSubject(f"no job or tenant is called {subject!r}; known: {', '.join(known) or 'none'}")


def _owner_of(daemon: Parts, subject: str) -> str | None:
    """The rule that owns the process whose pid is ``subject``, if one does."""
    view = daemon.snapshot.view
    if not subject.isdigit() or view is None:
        return None
    return next((rid for rid, obs in view.rules.items() if int(subject) in obs.pids), None)


def _own_id(job_id: str) -> str:
    """What follows the first dash of a job id: an outside scheduler's own job id (``17`` of
    ``batch-17``, ``17.0.1`` of a task of it, ``batch-17.0.1``), or a job's own short id; so
    ``explain 17`` answers for every task of the scheduler's job 17."""
    return job_id.split("-", 1)[1] if "-" in job_id else ""


def _job_duty_state(item: dict[str, Any], verdict: JobVerdict | None) -> str:
    codes_ = [r["code"] for r in item["reasons"]]
    if verdict is not None and verdict.state == "stopping":
        return "stopped"
    if "JOB_UNTRUSTED" in codes_:
        return "not trusted"
    if item["use"] != "none" and "cooperative_throttle" not in item["capabilities"] and item["state"] != "run":
        return "cannot throttle"
    if item["state"] != "run":
        return "held"
    measured = item["measured_busy"]
    if measured is not None and item["duty"] < 1 and measured > item["duty"] + 0.1:
        return "over its duty"
    return "holds its duty"


class _GovernorRow(TypedDict):
    """One rule's governor in :func:`duty_view`."""

    rule: str
    state: str
    budget: float
    ceiling: float
    baseline: float | None
    baseline_age_s: float | None
    pressure: float | None
    level: float | None
    take_back_left_s: float | None


def duty_view(daemon: Parts) -> dict[str, Any]:
    """The budget, each rule's governor and each job's asked and measured duty."""
    snap = daemon.snapshot
    decision = snap.decision
    now = time.monotonic()
    governors = dict(decision.state.governors) if decision else {}
    rules: list[_GovernorRow] = []
    for rid, gs in sorted(governors.items()):
        rules.append(
            {
                "rule": rid,
                "state": {"taken_back": "taken back"}.get(gs.mode, gs.mode),
                "budget": gs.budget,
                "ceiling": gs.ceiling,
                "baseline": gs.baseline,
                "baseline_age_s": None if gs.baseline_at is None else round(now - gs.baseline_at, 1),
                "pressure": None if gs.pressure is None else round(gs.pressure, 4),
                "level": gs.level,
                "take_back_left_s": None
                if gs.take_back_until is None
                else round(max(0.0, gs.take_back_until - now), 1),
            }
        )
    active = [r for r in rules if r["state"] != "off"]
    verdicts = decision.jobs if decision else {}
    jobs = []
    for record in snap.jobs:
        item = _job_item(daemon, record, verdicts.get(record.id))
        jobs.append(
            {
                "id": item["id"],
                "name": item["name"],
                "asked": item["duty"],
                "measured": item["measured_busy"],
                "reported": item["reported"].get("duty", {}).get("duty"),
                "state": _job_duty_state(item, verdicts.get(record.id)),
                "reasons": item["reasons"],
            }
        )
    if active:
        lowest = min(active, key=lambda r: r["budget"] if r["state"] == "running" else 0.0)
        budget = lowest["budget"] if lowest["state"] == "running" else 0.0
        ceiling = min(r["ceiling"] for r in active)
        beside = ", ".join(r["rule"] for r in active)
        sharing = [j for j in jobs if j["state"] in ("holds its duty", "over its duty")]
        share = (
            f"; {len(sharing)} job{'s' if len(sharing) != 1 else ''} at {sharing[0]['asked']:.2f} each"
            if sharing
            else "; no job holds a duty"
        )
        summary = f"budget {budget:.2f} of ceiling {ceiling:.2f} ({lowest['state']}) beside {beside}{share}"
    else:
        budget, ceiling = None, None
        summary = (
            f"no governor runs (gpu_jobs: {daemon.config.gpu_jobs}; it runs under certified while a protected "
            "program with a valid certificate uses the GPU)"
        )
    return {
        "gpu_jobs": daemon.config.gpu_jobs,
        "budget": budget,
        "ceiling": ceiling,
        "summary": summary,
        "rules": rules,
        "jobs": jobs,
    }


def status_line(daemon: Parts) -> str:
    """One line for ``systemctl status``: rules, jobs, and whether GPU fleet work may run."""
    decision = daemon.snapshot.decision
    rules = len(daemon.rulebook.live)
    active = len(daemon.jobs.active())
    admitted = "unknown" if decision is None else ("admitted" if decision.admits_gpu else "held")
    return f"{rules} rule(s), {active} active job(s), GPU fleet work {admitted}"
