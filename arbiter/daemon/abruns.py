"""Paired ON/OFF runs held by the daemon: checking a run before it starts, starting and
aborting it on the decision thread, and what ``arbiter ab status|show`` read.

The run itself is stepped by the pure decision (:mod:`arbiter.engine.abrun`); here are the
checks that need the daemon's state (the rule in force, its source as last read, the jobs
registered), the records kept in SQLite, and the certificate a passing run earns.
"""

from __future__ import annotations

import secrets
import socket
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

from arbiter.daemon.inbox import ChangeRun
from arbiter.engine import abrun, codes
from arbiter.state.certificates import Certificate, fingerprint

if TYPE_CHECKING:
    from arbiter.daemon.parts import Parts

APPLY_WAIT_S = 5.0


class RunRefused(Exception):
    """A run that cannot start, with what to do about it."""


def _number(args: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    raw = args.get(key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise RunRefused(f"--{key.replace('_', '-')} must be a number, not {raw!r}") from None
    if not low <= value <= high:
        raise RunRefused(f"--{key.replace('_', '-')} must be between {low:g} and {high:g}, not {value:g}")
    return value


def spec_from(args: dict[str, Any], run_id: str, sweep_id: str | None = None) -> abrun.RunSpec:
    rule = str(args.get("rule") or "")
    if not rule:
        raise RunRefused("name the protected program's rule with --rule (`arbiter status` lists them)")
    off = str(args.get("off") or "paused")
    if off not in ("paused", "evicted"):
        raise RunRefused(f"--off must be paused or evicted, not {off!r}")
    duty = None if args.get("duty") is None else _number(args, "duty", 1.0, 0.01, 1.0)
    window = _number(args, "window", 300.0, 1.0, 86400.0)
    washout = _number(args, "washout", 60.0, 0.0, 86400.0)
    if window <= washout:
        raise RunRefused(f"a window ({window:g}s) must be longer than its washout ({washout:g}s)")
    levels: tuple[float, ...] = ()
    if sweep_id is not None:
        raw = args.get("levels") or abrun.DEFAULT_LEVELS
        try:
            levels = tuple(float(x) for x in raw)
        except (TypeError, ValueError):
            raise RunRefused(f"--levels must be numbers, not {raw!r}") from None
        if not levels or any(not 0 < x <= 1 for x in levels) or list(levels) != sorted(set(levels)):
            raise RunRefused("--levels must be rising duties above 0 and at most 1, e.g. 0.1,0.2,0.35,0.5")
        duty, levels = levels[0], levels[1:]
    return abrun.RunSpec(
        run_id=run_id,
        rule_id=rule,
        work=str(args.get("work") or "gpu"),
        duty=duty,
        blocks=int(_number(args, "blocks", 12, 2, 10_000)),
        window_s=window,
        washout_s=washout,
        margin=_number(args, "margin", 0.02, 0.001, 0.5),
        off=off,  # type: ignore[arg-type]
        max_hours=_number(args, "max_hours", 8.0, 0.001, 24 * 14),
        seed=run_id,
        sweep_id=sweep_id,
        levels=levels,
    )


def plan(daemon: Parts, spec: abrun.RunSpec) -> dict[str, Any]:
    """What the run will do, or :class:`RunRefused` with why it cannot start now."""
    policy = daemon.decider.policy
    rp = policy.rules.get(spec.rule_id)
    live = daemon.rulebook.live.get(spec.rule_id)
    if rp is None or live is None:
        raise RunRefused(f"no rule {spec.rule_id!r} is in force (`arbiter status` lists the rules)")
    if not rp.protected or not rp.progress or live.rule.protect is None or live.rule.protect.source is None:
        raise RunRefused(
            f"rule {spec.rule_id!r} reads no progress: give it `protect: {{source: ...}}` "
            "(a jsonl or log source the program writes) so a run can measure it"
        )
    if policy.gpu_jobs == "never":
        raise RunRefused("this node runs no GPU fleet work (gpu_jobs: never): nothing to measure")
    current = daemon.decider.engine_state.ab
    if current is not None and current.running:
        raise RunRefused(
            f"run {current.spec.run_id} is in progress; one run at a time "
            f"(`arbiter ab abort {current.spec.run_id}` ends it)"
        )
    decision = daemon.snapshot.decision
    verdict = decision.rules.get(spec.rule_id) if decision else None
    if verdict is None or not verdict.running:
        raise RunRefused(f"{spec.rule_id!r}'s program is not running: start it first (a run measures it working)")
    source = daemon.intake.book.observed((spec.rule_id, -1), time.monotonic())
    if not source.readable or source.count is None:
        raise RunRefused(
            f"{spec.rule_id!r}'s progress source does not read ({source.why or 'not read yet'}); "
            "`arbiter status` shows it"
        )
    view = daemon.snapshot.view
    jobs = daemon.jobs.observations(view.job_processes if view else {}, time.monotonic())
    matching = [j for j in jobs.values() if abrun.covers(spec.work, j)]
    if not matching:
        raise RunRefused(
            f"no job matches --work {spec.work} (gpu, cpu, all or a job name): start the work first "
            "with `arbiter job run`"
        )
    if spec.duty is not None and spec.duty < 1 and not any("cooperative_throttle" in j.capabilities for j in matching):
        raise RunRefused(
            f"--duty {spec.duty:g} needs work that holds a duty (capability cooperative_throttle); "
            f"{', '.join(sorted({j.name for j in matching}))} cannot: leave --duty out"
        )
    if spec.off == "evicted":
        stuck = sorted({j.name for j in matching if "cancellable" not in j.capabilities})
        if stuck:
            raise RunRefused(
                f"--off evicted stops the work in OFF windows to free its memory; {', '.join(stuck)} "
                "do(es) not declare cancellable: use --off paused"
            )
    hours = spec.planned_hours(max(spec.blocks, spec.pilot))
    if hours > spec.max_hours:
        raise RunRefused(
            f"{spec.blocks} blocks of two {spec.window_s:g}s windows take {hours:.2f} h, more than "
            f"--max-hours {spec.max_hours:g}: fewer blocks, shorter windows or more hours"
        )
    block = live.rule.protect.source
    return {
        "run": spec.run_id,
        "sweep": spec.sweep_id,
        "rule": spec.rule_id,
        "source": {"kind": block.kind, **block.options()},
        "source_rate": source.rate,
        "work": spec.work,
        "jobs": sorted(j.job_id for j in matching),
        "duty": spec.duty,
        "levels": list(spec.levels),
        "blocks": spec.blocks,
        "window_s": spec.window_s,
        "washout_s": spec.washout_s,
        "margin": spec.margin,
        "off": spec.off,
        "max_hours": spec.max_hours,
        "planned_hours": round(hours, 4),
    }


def new_ids(sweep: bool) -> tuple[str, str | None]:
    if sweep:
        sweep_id = f"sweep-{secrets.token_hex(3)}"
        return f"{sweep_id}-1", sweep_id
    return f"ab-{secrets.token_hex(3)}", None


def apply(daemon: Parts, change: Any) -> Any:
    """Run ``change(current run) -> (new run, answer)`` on the decision thread (which owns the
    engine state) and wait for its answer."""
    answer: Future[Any] = Future()
    daemon.decider.tell(ChangeRun(change, answer))
    try:
        return answer.result(APPLY_WAIT_S)
    except FutureTimeout:
        if answer.cancel():  # the decision thread had not taken it: nothing changed
            raise RunRefused("the daemon did not take the request in time; nothing changed: ask again") from None
        return answer.result()  # taken meanwhile: its answer comes at once


def start(daemon: Parts, spec: abrun.RunSpec, uid: int) -> dict[str, Any]:
    planned = plan(daemon, spec)

    def change(current: abrun.RunState | None) -> tuple[abrun.RunState, dict[str, Any]]:
        if current is not None and current.running:  # another start won the race
            raise RunRefused(f"run {current.spec.run_id} is in progress; one run at a time")
        daemon.recorder.event(
            codes.AB_RUN_STARTED,
            spec.rule_id,
            f"paired run {spec.run_id} started on {spec.rule_id!r} "
            f"({spec.work} work, {planned['planned_hours']:.2f} h planned) by uid {uid}",
            planned,
        )
        return abrun.start(spec, time.time()), planned

    return apply(daemon, change)  # type: ignore[no-any-return]


def abort(daemon: Parts, run_id: str, uid: int) -> dict[str, Any]:
    def change(current: abrun.RunState | None) -> tuple[abrun.RunState, dict[str, Any]]:
        if current is None or not current.running or run_id not in (current.spec.run_id, current.spec.sweep_id):
            raise RunRefused(f"no run {run_id!r} is in progress (`arbiter ab status` lists the runs)")
        ended = abrun.abort(current, f"aborted by uid {uid}", time.time())
        spec = ended.spec
        daemon.recorder.event(
            codes.AB_RUN_DONE,
            spec.rule_id,
            f"run {spec.run_id} aborted by uid {uid}: no certificate",
            {"run": spec.run_id, "rule": spec.rule_id, "status": "aborted", "uid": uid},
        )
        if spec.sweep_id is not None:
            best = max(ended.passed) if ended.passed else None
            daemon.recorder.event(
                codes.AB_SWEEP_DONE,
                spec.rule_id,
                f"sweep {spec.sweep_id} aborted by uid {uid}"
                + (f"; the levels passed before stand (certified duty {best:g})" if best is not None else ""),
                {"sweep": spec.sweep_id, "passed": list(ended.passed), "certified_duty": best},
            )
        return ended, {"run": spec.run_id}

    return apply(daemon, change)  # type: ignore[no-any-return]


def certificate(daemon: Parts, run: abrun.RunState) -> None:
    """Issue the certificate a passing run earned.  Hashing the program's executable may take
    a while (the first time): it runs on a worker thread, then the recorder commits."""
    view = daemon.snapshot.view
    spec = run.spec
    exe = view.rule_exes.get(spec.rule_id) if view else None
    node = fingerprint(view.machine if view else {}, list(view.gpus) if view else [], view.driver if view else "")
    a = abrun.analysis(run)
    if a is None:  # a run passes only with its blocks analysed
        raise AssertionError(f"run {spec.run_id} passed without an analysis")
    duty = abrun.certified_duty(run)

    def issue() -> None:
        digest = daemon.ticker.hasher.digest(exe) if exe else None
        if duty is None or not exe or digest is None:
            why = (
                "the work's duty was not measured in every block"
                if duty is None
                else f"{spec.rule_id!r}'s executable cannot be read to bind the certificate to it"
            )
            daemon.recorder.event(
                codes.CERT_NOT_ISSUED,
                spec.rule_id,
                f"run {spec.run_id} passed but earns no certificate: {why}",
                {
                    "run": spec.run_id,
                    "exe": exe,
                    "remedy": "keep the program running until the run ends, and "
                    "let the daemon's account read its executable; then run it again",
                },
            )
            return
        cert = Certificate(
            rule=spec.rule_id,
            work=spec.work,
            duty=duty,
            r=a.r,
            r_low=a.low,
            r_high=a.high,
            margin=spec.margin,
            run_id=spec.run_id,
            issued_at=time.time(),
            node=socket.gethostname(),
            fingerprint=node,
            exe_path=exe,
            exe_sha256=digest,
        )

        def write(db: Any) -> None:
            from arbiter.state.store import Store

            cert_id = Store.insert_certificate(db, cert)
            daemon.recorder.event(
                codes.CERT_ISSUED,
                spec.rule_id,
                f"certificate {cert_id}: {spec.work} work at duty {duty:g} "
                f"beside {spec.rule_id!r}, R {a.r:.4f} ({a.confidence * 100:g} % {a.low:.4f}–{a.high:.4f}), margin {spec.margin:g}",
                {"certificate": cert_id, "run": spec.run_id, "duty": duty, "work": spec.work, "r": a.r},
            )
            daemon.ticker.certificates_changed()

        daemon.recorder.write(write)
        daemon.fleet.publish(cert, run)

    daemon.tenants.submit(issue)


def supersede(daemon: Parts, run: abrun.RunState) -> None:
    """A slowdown at a duty retires the rule's certificates for that work at that duty or above."""
    spec = run.spec
    duty = spec.duty if spec.duty is not None else 1.0
    why = f"run {spec.run_id} showed a slowdown at duty {duty:g} (run `arbiter ab sweep --rule {spec.rule_id}`)"

    def write(db: Any) -> None:
        from arbiter.state.store import Store

        if Store.supersede(db, spec.rule_id, spec.work, duty, spec.run_id, why):
            daemon.recorder.event(
                codes.CERT_SUPERSEDED,
                spec.rule_id,
                f"certificates of {spec.rule_id!r} for {spec.work} work at "
                f"duty {duty:g} or more no longer stand: {why}",
                {"run": spec.run_id, "superseded": True},
            )
            daemon.ticker.certificates_changed()

    daemon.recorder.write(write)


def live(daemon: Parts, rs: abrun.RunState) -> dict[str, Any]:
    """The run in progress as status shows it: the window now and how far it has come."""
    out: dict[str, Any] = {"blocks_done": len(rs.blocks), "target": rs.target, "excluded": len(rs.excluded)}
    w = rs.window
    if w is not None and rs.running:
        now = time.monotonic()
        out["window"] = {
            "block": w.attempt + 1,
            "arm": w.arm,
            "second": w.second,
            "measuring": now >= w.measure_from,
            "ends_in_s": round(max(0.0, w.ends_at - now), 2),
        }
    spec = rs.spec
    block_s = 2 * spec.window_s
    left = max(0, rs.target - len(rs.blocks)) * block_s
    if w is not None and rs.running:
        left -= (block_s / 2 if w.second else 0) + (spec.window_s - out["window"]["ends_in_s"])
    out["left_s"] = round(max(0.0, left), 1) if rs.running else 0.0
    return out


def records(daemon: Parts) -> list[dict[str, Any]]:
    """Every run on record, the one in progress as the decision thread has it now."""
    current = daemon.decider.engine_state.ab
    out = daemon.store.runs()
    if current is not None:
        rec = abrun.to_record(current)
        out = [rec if r["spec"]["run_id"] == current.spec.run_id else r for r in out]
        if not any(r["spec"]["run_id"] == current.spec.run_id for r in out):
            out.insert(0, rec)
    return out


def find(daemon: Parts, run_id: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A run's record and, while it runs, its live part."""
    current = daemon.decider.engine_state.ab
    if current is not None and current.spec.run_id == run_id:
        return abrun.to_record(current), live(daemon, current)
    rec = daemon.store.run(run_id)
    if rec is None:
        raise RunRefused(f"no run {run_id!r} (`arbiter ab status` lists them)")
    return rec, None


def brief(rec: dict[str, Any], live_part: dict[str, Any] | None) -> dict[str, Any]:
    spec = rec["spec"]
    return {
        "run": spec["run_id"],
        "sweep": spec.get("sweep_id"),
        "rule": spec["rule_id"],
        "work": spec["work"],
        "duty": spec["duty"],
        "status": rec["status"],
        "verdict": rec.get("verdict") or "",
        "why": rec.get("why") or "",
        "blocks_done": len(rec.get("blocks") or ()),
        "target": rec["target"],
        "excluded": len(rec.get("excluded") or ()),
        "started": rec["started_wall"],
        "ended": rec.get("ended_wall"),
        "live": live_part,
    }


def status(daemon: Parts) -> list[dict[str, Any]]:
    current = daemon.decider.engine_state.ab
    out = []
    for rec in records(daemon):
        live_part = (
            live(daemon, current)
            if current is not None and current.running and rec["spec"]["run_id"] == current.spec.run_id
            else None
        )
        out.append(brief(rec, live_part))
    return out


def resumed_from(rec: dict[str, Any] | None) -> tuple[abrun.RunState | None, str]:
    """The run a previous daemon left running, ready to go on (or why it cannot)."""
    if rec is None:
        return None, ""
    try:
        return abrun.from_record(rec), ""  # its blocks stand; the window in progress was never kept
    except (KeyError, TypeError, ValueError) as exc:
        return None, f"run {rec.get('spec', {}).get('run_id', '?')} could not be resumed from its record: {exc}"
