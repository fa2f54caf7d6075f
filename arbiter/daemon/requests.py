"""What the daemon answers on its socket, and who may ask.

Anyone may read.  A job is acted on only by the uid that registered it, root, or the
daemon's own user.  Node-wide changes need root, the daemon's user or the admin group.
"""

from __future__ import annotations

import grp
import math
import pwd
import time
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from arbiter import __version__
from arbiter.config.models import Manifest
from arbiter.daemon.quotas import job_quota_problem, rate_problem
from arbiter.daemon.views import UnknownSubject, duty_view, explain_view, status_view
from arbiter.engine import codes
from arbiter.plugin import ProcessInfo
from arbiter.pluginmanager import PluginFailed
from arbiter.probing import placement

if TYPE_CHECKING:
    from arbiter.daemon.facade import Node
    from arbiter.store import JobRecord

MAX_WAIT_S = 5.0
PROBE_WAIT_S = 45.0  # the first run of every probe, on a slow host
#: how often, at most, an account that is not an administrator gets the probes run anew
PROBE_REFRESH_EVERY_S = 60.0


class Refused(Exception):
    def __init__(self, message: str, code: str = "REFUSED") -> None:
        self.code = code
        super().__init__(message)


def may_act_on_job(peer_uid: int, owner_uid: int, daemon_uid: int) -> bool:
    return peer_uid in (0, daemon_uid, owner_uid)


def group_members(group: str) -> set[int]:
    """uids in ``group`` (as primary or supplementary group); empty when it does not exist."""
    try:
        g = grp.getgrnam(group)
    except KeyError:
        return set()
    uids = {p.pw_uid for p in pwd.getpwall() if p.pw_gid == g.gr_gid}
    for name in g.gr_mem:
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            continue
    return uids


def may_admin(peer_uid: int, daemon_uid: int, admin_uids: set[int]) -> bool:
    return peer_uid in (0, daemon_uid) or peer_uid in admin_uids


def _text_arg(op: str, args: dict[str, Any], name: str) -> str | None:
    """An optional text argument (None or "" when not given)."""
    value = args.get(name)
    if value is None or isinstance(value, str):
        return value
    raise Refused(f"{op}: argument {name!r} must be text, not {type(value).__name__}", "BAD_REQUEST")


def _number_arg(op: str, args: dict[str, Any], name: str, default: float | None = None, whole: bool = False) -> float:
    """A finite number argument (bool is not one), ``default`` when not given."""
    value = args.get(name, default)
    if value is None:
        raise Refused(f"{op}: argument {name!r} is missing", "BAD_REQUEST")
    if isinstance(value, str):
        try:
            value = float(value)  # the CLI may pass what the user typed
        except ValueError:
            pass
    kind = "a whole number" if whole else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise Refused(f"{op}: argument {name!r} must be {kind}, not {value!r}"[:300], "BAD_REQUEST")
    if whole and (value != int(value) or abs(value) >= 2**63):  # what SQLite stores
        raise Refused(f"{op}: argument {name!r} must be {kind} of at most 63 bits, not {value!r}"[:300], "BAD_REQUEST")
    return value


def _job(daemon: Node, args: dict[str, Any], uid: int) -> JobRecord:
    job_id = str(args.get("id", ""))
    record = daemon.jobs.get(job_id)
    if record is None:
        raise Refused(f"no running job has id {job_id!r}; `arbiter status` lists them", "NO_SUCH_JOB")
    if not may_act_on_job(uid, record.owner_uid, daemon.uid):
        raise Refused(
            f"job {job_id} belongs to uid {record.owner_uid}; only its owner, root or the daemon's user may act on it",
            "FORBIDDEN",
        )
    return record


def _process(daemon: Node, pid: int) -> ProcessInfo:
    try:
        table = daemon.observer.process_table()
    except PluginFailed as exc:
        raise Refused(f"cannot read the process table: {exc}", "PLUGIN_FAILED") from None
    for p in table:
        if p.pid == pid:
            return p
    raise Refused(f"process {pid} does not exist", "NO_SUCH_PROCESS")


def _verdict(daemon: Node, job_id: str) -> dict[str, Any]:
    decision = daemon.snapshot.decision
    verdict = decision.jobs.get(job_id) if decision else None
    record = daemon.jobs.get(job_id)
    if record is None:
        return {"state": "ended", "admitted": False, "reasons": []}
    if verdict is None:
        return {"state": "held", "admitted": False, "reasons": []}
    return {
        "state": verdict.state,
        "admitted": verdict.admitted,
        "duty": verdict.duty,
        "reasons": [r.to_dict() for r in verdict.reasons],
        "seq": record.seq,
    }


def handle(daemon: Node, op: str, args: dict[str, Any], peer: tuple[int, int]) -> dict[str, Any]:
    peer_pid, uid = peer
    try:
        return {"ok": True, **_handle(daemon, op, args, peer_pid, uid)}
    except Refused as exc:
        return {"ok": False, "error": str(exc), "code": exc.code}
    except UnknownSubject as exc:
        return {"ok": False, "error": str(exc), "code": "UNKNOWN_SUBJECT"}


def _handle(daemon: Node, op: str, args: dict[str, Any], peer_pid: int, uid: int) -> dict[str, Any]:
    if op == "ping":
        return {"version": __version__}
    if op == "status":
        return {"status": status_view(daemon)}
    if op == "explain":
        return {"explain": explain_view(daemon, _text_arg(op, args, "subject") or None)}
    if op == "doctor":
        from arbiter.doctor import daemon_items

        return {"items": [i.to_dict() for i in daemon_items(daemon)]}
    if op == "gpu-apis":
        if args.get("refresh"):
            # the probes run as the daemon's account: any other account's asking starts a run
            # at most once a while, so no one can keep them running
            admin = may_admin(uid, daemon.uid, group_members(daemon.config.admin_group))
            answer = daemon.prober.refresh(PROBE_WAIT_S, 0.0 if admin else PROBE_REFRESH_EVERY_S)
        else:
            answer = daemon.prober.get(PROBE_WAIT_S)
        if answer is None:
            raise Refused(f"the GPU API probes have not answered within {PROBE_WAIT_S:g}s; ask again", "BUSY")
        return {"gpu_apis": answer}
    if op == "duty":
        return {"duty": duty_view(daemon)}
    if op == "certificates":
        view = daemon.snapshot.view
        return {
            "certificates": list(daemon.certificate_states),
            "node": daemon.node_fingerprint(),
            "programs": dict(view.rule_exes) if view else {},
        }
    if op == "timeline":
        limit = max(1, min(int(_number_arg(op, args, "limit", 50, whole=True)), 10_000))
        subject, code = _text_arg(op, args, "subject"), _text_arg(op, args, "code")
        return {"events": daemon.store.timeline(limit, subject, code)}

    if op == "job.register":
        try:
            manifest = Manifest.model_validate(args.get("manifest") or {})
        except ValidationError as exc:
            raise Refused(f"invalid job manifest: {exc}", "BAD_MANIFEST") from None
        cmd = args.get("cmd")
        if not isinstance(cmd, list) or not cmd or not all(isinstance(c, str) for c in cmd):
            raise Refused("cmd must be a non-empty list of strings", "BAD_REQUEST")
        over = job_quota_problem(daemon.config.quotas, daemon.jobs, uid, cmd)
        if over:
            raise Refused(over, "QUOTA")
        # the launcher is the caller itself: its pid comes from the socket, not from the request
        launcher = peer_pid or int(_number_arg(op, args, "launcher_pid", 0, whole=True))
        warnings: list[str] = []
        if manifest.gpu_for(daemon.jobs.platform).apis_any:
            provided = daemon.prober.get(PROBE_WAIT_S)
            if provided is None:  # never judged against an answer not there yet
                raise Refused(f"the GPU API probes have not answered within {PROBE_WAIT_S:g}s; run it again", "BUSY")
            why, warnings = placement(manifest, daemon.jobs.platform, provided)
            if why is not None:
                raise Refused(
                    f"this host cannot run job {manifest.name!r}: {why}; health: undetected (not an alert)",
                    codes.GPU_API_UNAVAILABLE,
                )
        try:
            record = daemon.jobs.register(uid, manifest, cmd, launcher, _process(daemon, launcher).start_time)
        except OSError as exc:  # a jobs folder that is not plainly the daemon's own, a full disk
            raise Refused(
                f"cannot make the folder of job {manifest.name!r} in {daemon.jobs.jobs_dir}: {exc.strerror or exc}; "
                "`arbiter doctor` and the daemon's log say more",
                "STATE_DIR",
            ) from None
        daemon.notify_jobs()
        daemon.recorder.flush()  # answered once on disk: a daemon killed right after still knows the job
        return {
            "job": {"id": record.id, "control_path": record.control_path, "events_path": record.events_path},
            "warnings": warnings,
        }
    if op == "job.adopt":
        return _adopt(daemon, args, peer_pid, uid)
    if op == "job.wait":
        record = _job(daemon, args, uid)
        deadline = time.monotonic() + max(0.0, min(_number_arg(op, args, "timeout", 1.0), MAX_WAIT_S))
        with daemon.jobs.changed:
            while True:
                answer = _verdict(daemon, record.id)
                remaining = deadline - time.monotonic()
                if answer["admitted"] or remaining <= 0:
                    return answer
                daemon.jobs.changed.wait(remaining)
    if op == "job.started":
        record = _job(daemon, args, uid)
        if record.root_pid is not None:
            raise Refused(f"job {record.id} has started already (process {record.root_pid})", "BAD_REQUEST")
        proc = _process(daemon, int(_number_arg(op, args, "pid", whole=True)))
        # only a child of the job's own launcher, running as the job's owner, can become the
        # job: otherwise a caller could have arbiter pause or end any process
        if proc.ppid != record.launcher_pid or proc.uid != record.owner_uid:
            raise Refused(
                f"process {proc.pid} is not a child of job {record.id}'s launcher running as uid {record.owner_uid}",
                "FORBIDDEN",
            )
        daemon.jobs.update(record.id, root_pid=proc.pid, root_start=proc.start_time, state="running")
        daemon.notify_jobs()
        daemon.recorder.flush()  # as for the registration: the process to resume after a crash is on disk
        return {}
    if op == "job.exited":
        record = _job(daemon, args, uid)
        exit_code = None if args.get("exit_code") is None else int(_number_arg(op, args, "exit_code", whole=True))
        daemon.end_job(record, exit_code, f"its command exited with {exit_code}")
        return {}
    if op in ("job.stop", "job.pause", "job.resume"):
        record = _job(daemon, args, uid)
        if op == "job.stop":
            if record.root_pid is None:
                daemon.end_job(record, None, "stopped by its owner before it started")
            else:
                daemon.jobs.update(record.id, stop_requested=time.time())
        else:
            daemon.jobs.update(record.id, user_hold=op == "job.pause")
        daemon.notify_jobs()
        return {}
    if op.startswith("ab."):
        return _ab(daemon, op, args, uid)
    if op == "reload":
        if not may_admin(uid, daemon.uid, group_members(daemon.config.admin_group)):
            raise Refused(
                f"reloading needs root, the daemon's user or membership of group {daemon.config.admin_group!r}",
                "FORBIDDEN",
            )
        daemon.request_reload()
        return {}
    raise Refused(f"unknown request {op!r}", "BAD_REQUEST")


def _adopt(daemon: Node, args: dict[str, Any], peer_pid: int, uid: int) -> dict[str, Any]:
    """A running process handed over by an outside scheduler's hook (see
    :mod:`arbiter.daemon.adopt`): only root, the daemon's user, or the process's own user
    for itself or its parent, under an id of its own or a free one that its scheduler, if
    any, says is the caller's."""
    from arbiter.daemon import adopt

    job_id = _text_arg("job.adopt", args, "id") or ""
    manifest = args.get("manifest")
    if manifest is not None and not isinstance(manifest, dict):
        raise Refused("job.adopt: argument 'manifest' must be a mapping", "BAD_REQUEST")
    try:
        adopt.check_id(job_id)
        parsed = adopt.parse_manifest(job_id, manifest)
        proc = _process(daemon, int(_number_arg("job.adopt", args, "pid", whole=True)))
        peer = None
        if peer_pid:
            try:
                peer = _process(daemon, peer_pid)
            except Refused:
                peer = None
        why = adopt.may_hand_over(uid, peer, proc, daemon.uid) or adopt.may_take_id(daemon, job_id, uid)
        if why is not None:
            raise Refused(f"job.adopt: {why}", "FORBIDDEN")
        over = rate_problem(daemon.config.quotas, daemon.jobs, uid)
        if over:
            raise Refused(f"job.adopt: {over}", "QUOTA")
        record, new = adopt.adopt(daemon, job_id, proc, parsed, f"handed over by process {peer_pid}")
    except adopt.AdoptRefused as exc:
        raise Refused(str(exc), exc.code) from None
    return {
        "job": {"id": record.id, "control_path": record.control_path, "events_path": record.events_path},
        "new": new,
    }


def _ab(daemon: Node, op: str, args: dict[str, Any], uid: int) -> dict[str, Any]:
    """Paired ON/OFF runs: anyone may read them; starting and aborting are node-wide changes."""
    from arbiter.daemon import abruns

    try:
        if op == "ab.status":
            return {"runs": abruns.status(daemon)}
        if op == "ab.show":
            from arbiter.harness.report import report

            rec, live = abruns.find(daemon, str(args.get("id", "")))
            return {"report": report(rec, live)}
        if not may_admin(uid, daemon.uid, group_members(daemon.config.admin_group)):
            raise Refused(
                f"paired runs need root, the daemon's user or membership of group {daemon.config.admin_group!r}",
                "FORBIDDEN",
            )
        if op in ("ab.plan", "ab.start", "ab.sweep"):
            run_id, sweep_id = abruns.new_ids(op == "ab.sweep" or bool(args.get("sweep")))
            spec = abruns.spec_from(args, run_id, sweep_id)
            if op == "ab.plan":
                return {"plan": abruns.plan(daemon, spec)}
            return {"plan": abruns.start(daemon, spec, uid)}
        if op == "ab.abort":
            return abruns.abort(daemon, str(args.get("id", "")), uid)
    except abruns.RunRefused as exc:
        raise Refused(str(exc), "AB_REFUSED") from None
    raise Refused(f"unknown request {op!r}", "BAD_REQUEST")
