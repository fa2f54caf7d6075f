"""The daemon's table of operations: one method per operation, each with who may call it.

The socket dispatches a request line to the method its ``op`` names (:meth:`NodeApi.dispatch`),
after checking the caller's right to it and its arguments against the method's signature;
the HTTP listener calls the same methods (its reads are anyone's, its one change needs the
token); the CLI asks by the names of :class:`arbiter.api.ops.Op`.  A method's parameters are
its typed request: text, numbers, whole numbers, flags, a list of text or a mapping; two
names are given by the table rather than the caller: ``caller`` (who asks) and ``job`` (the
job the request's ``id`` names, once the caller's right to it is checked).

It runs past 400 lines because it holds every operation, each with its checks, in one place.
"""

from __future__ import annotations

import grp
import inspect
import math
import pwd
import time
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import ValidationError

from arbiter import __version__
from arbiter.api.ops import Caller, Op, Who
from arbiter.config.models import Manifest
from arbiter.daemon.quotas import job_quota_problem
from arbiter.daemon.views import UnknownSubject, duty_view, explain_view, status_view
from arbiter.engine import codes
from arbiter.plugin import ProcessInfo
from arbiter.pluginmanager import PluginFailed
from arbiter.probing import placement
from arbiter.state.store import JobRecord

if TYPE_CHECKING:
    from arbiter.daemon.parts import Parts

MAX_WAIT_S = 5.0
PROBE_WAIT_S = 45.0  # the first run of every probe, on a slow host
#: how often, at most, an account that is not an administrator gets the probes run anew
PROBE_REFRESH_EVERY_S = 60.0
PLOT_TIMEOUT_S = 60.0

F = TypeVar("F", bound=Callable[..., Any])


class Refused(Exception):
    """A request the daemon does not carry out: its code and a message the caller can act on."""

    def __init__(self, message: str, code: str = "REFUSED") -> None:
        self.code = code
        super().__init__(message)


class RunNotFound(Refused, LookupError):
    """No paired run has the id asked for (the HTTP listener answers 404)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "AB_REFUSED")


@dataclass(frozen=True)
class Declared:
    op: Op
    who: Who
    #: the answer's one field the method's value goes in; None: the method returns the fields
    answer: str | None
    #: for the job's owner: the request's ``id`` may also be the name of one running job
    by_name: bool = False


def operation(op: Op, who: Who, answer: str | None = None, by_name: bool = False) -> Callable[[F], F]:
    """Declare a method of :class:`NodeApi` the operation ``op``, callable by ``who``."""

    def declare(fn: F) -> F:
        fn.__arbiter_op__ = Declared(op, who, answer, by_name)  # type: ignore[attr-defined]
        return fn

    return declare


#: a parameter the caller gives: its name, its type, whether it may be left out
Param = tuple[str, Any, bool]
#: parameters the table gives: who asks, and the job the request's ``id`` names
GIVEN = ("self", "caller", "job")


@dataclass(frozen=True)
class Entry:
    declared: Declared
    method: Callable[..., Any]
    params: tuple[Param, ...]
    wants_caller: bool
    #: the method takes the request's other arguments as they are (``**settings``)
    takes_rest: bool


def declared(cls: type) -> dict[Op, Entry]:
    """Every operation ``cls`` declares, with its method and the parameters its caller gives."""
    out: dict[Op, Entry] = {}
    for _, fn in inspect.getmembers(cls, inspect.isfunction):
        decl = getattr(fn, "__arbiter_op__", None)
        if not isinstance(decl, Declared):
            continue
        hints = typing.get_type_hints(fn)
        signature = inspect.signature(fn).parameters
        named = {n: p for n, p in signature.items() if p.kind is not inspect.Parameter.VAR_KEYWORD}
        params = tuple(
            (name, hints[name], p.default is not inspect.Parameter.empty)
            for name, p in named.items()
            if name not in GIVEN
        )
        out[decl.op] = Entry(decl, fn, params, "caller" in signature, len(named) < len(signature))
    return out


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


def may_act_on_job(peer_uid: int, owner_uid: int, daemon_uid: int) -> bool:
    return peer_uid in (0, daemon_uid, owner_uid)


def may_admin(peer_uid: int, daemon_uid: int, admin_uids: set[int]) -> bool:
    return peer_uid in (0, daemon_uid) or peer_uid in admin_uids


# --- a request's arguments, checked against the method's signature ---------------------------


def _number(op: str, name: str, value: Any, whole: bool) -> float:
    if isinstance(value, str):
        try:
            value = float(value)  # the CLI may pass what the user typed
        except ValueError:
            pass
    kind = "a whole number" if whole else "a number"
    try:
        finite = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        finite = False
    if not finite:
        raise Refused(f"{op}: argument {name!r} must be {kind}, not {value!r}"[:300], "BAD_REQUEST")
    if whole:
        if value != int(value) or abs(value) >= 2**63:  # what SQLite stores
            raise Refused(
                f"{op}: argument {name!r} must be {kind} of at most 63 bits, not {value!r}"[:300], "BAD_REQUEST"
            )
        return int(value)
    return float(value)


def _argument(op: str, name: str, hint: Any, value: Any) -> Any:
    """``value`` as the parameter's type says, or :class:`Refused` naming the argument."""
    optional = False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        inner = [h for h in typing.get_args(hint) if h is not type(None)]
        optional, hint = True, inner[0]
    if value is None and optional:
        return None
    if hint is str:
        if isinstance(value, str):
            return value
        raise Refused(f"{op}: argument {name!r} must be text, not {type(value).__name__}", "BAD_REQUEST")
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise Refused(f"{op}: argument {name!r} must be true or false, not {value!r}"[:300], "BAD_REQUEST")
    if hint in (int, float):
        return _number(op, name, value, whole=hint is int)
    origin = typing.get_origin(hint)
    if origin is list:
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return value
        raise Refused(f"{op}: argument {name!r} must be a non-empty list of text", "BAD_REQUEST")
    if origin is dict:
        if isinstance(value, dict):
            return value
        raise Refused(f"{op}: argument {name!r} must be a mapping", "BAD_REQUEST")
    raise TypeError(f"{op}: the table cannot read a parameter of type {hint!r}")


def arguments(op: str, params: tuple[Param, ...], args: dict[str, Any], rest: bool = False) -> dict[str, Any]:
    """The method's keyword arguments from the request's, each checked by name; with
    ``rest``, the others too, as they are (the method checks them)."""
    out: dict[str, Any] = {}
    if rest:
        named = {name for name, _, _ in params} | set(GIVEN)
        out.update({k: v for k, v in args.items() if k not in named})
    for name, hint, optional in params:
        if args.get(name) is None:
            if not optional:
                raise Refused(f"{op}: argument {name!r} is missing", "BAD_REQUEST")
            continue
        out[name] = _argument(op, name, hint, args[name])
    return out


# --- the table ------------------------------------------------------------------------------------


class NodeApi:
    """Every operation of the daemon.  Methods read the published snapshot and the
    collaborators' own thread-safe views; changes go to the thread that owns them."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self._table = declared(type(self))
        self._plots: dict[str, tuple[str, bytes]] = {}  # run id → (what it showed, its PNG)

    @property
    def token(self) -> str:
        """What the HTTP listener asks of a change (``reload``)."""
        return self.parts.token

    # --- rights -----------------------------------------------------------------------------

    def is_admin(self, caller: Caller) -> bool:
        return may_admin(caller.uid, self.parts.uid, group_members(self.parts.config.admin_group))

    def _job_of(self, op: str, caller: Caller, args: dict[str, Any], by_name: bool) -> JobRecord:
        """The job ``args["id"]`` names; with ``by_name``, a running job's name names it too (as
        ``explain`` takes it), where one running job has that name."""
        job_id = args.get("id")
        if not isinstance(job_id, str) or not job_id:
            raise Refused(f"{op}: argument 'id' must name a job", "BAD_REQUEST")
        record = self.parts.jobs.get(job_id)
        if by_name and (record is None or record.owner_uid != caller.uid):
            # the caller's own running job of that name comes first: another account's job
            # of the same name, or one it gave that name as its id, never stands in for it
            named = [r for r in self.parts.jobs.active() if r.name == job_id]
            own = [r for r in named if r.owner_uid == caller.uid]
            pick = own or (named if record is None else [])
            if len(pick) > 1:
                raise Refused(
                    f"{len(pick)} running jobs are called {job_id!r} ({', '.join(sorted(r.id for r in pick))}): "
                    "give the one you mean by its id",
                    "NO_SUCH_JOB",
                )
            record = pick[0] if pick else record
        if record is None:
            raise Refused(f"no running job has id {job_id!r}; `arbiter status` lists them", "NO_SUCH_JOB")
        if not may_act_on_job(caller.uid, record.owner_uid, self.parts.uid):
            raise Refused(
                f"job {job_id} belongs to uid {record.owner_uid}; only its owner, root or the daemon's user may act on it",
                "FORBIDDEN",
            )
        return record

    def dispatch(self, op: str, args: dict[str, Any], peer: tuple[int, int]) -> dict[str, Any]:
        """The socket's answer to one request line from ``peer`` (pid, uid)."""
        try:
            return {"ok": True, **self.call(op, args, Caller(*peer))}
        except Refused as exc:
            return {"ok": False, "error": str(exc), "code": exc.code}
        except UnknownSubject as exc:
            return {"ok": False, "error": str(exc), "code": "UNKNOWN_SUBJECT"}

    def call(self, op: str, args: dict[str, Any], caller: Caller) -> dict[str, Any]:
        try:
            entry = self._table[Op(op)]
        except ValueError:
            raise Refused(f"unknown request {op!r}", "BAD_REQUEST") from None
        decl = entry.declared
        given = arguments(op, entry.params, args, entry.takes_rest)
        if decl.who is Who.ADMIN and not self.is_admin(caller):
            raise Refused(
                f"{op} needs root, the daemon's user or membership of group {self.parts.config.admin_group!r}",
                "FORBIDDEN",
            )
        if entry.wants_caller:
            given["caller"] = caller
        if decl.who is Who.JOB_OWNER:
            given["job"] = self._job_of(op, caller, args, decl.by_name)
        value = entry.method(self, **given)
        return {decl.answer: value} if decl.answer else dict(value)

    # --- reads: anyone ----------------------------------------------------------------------

    @operation(Op.PING, Who.ANYONE, "version")
    def ping(self) -> str:
        return __version__

    @operation(Op.STATUS, Who.ANYONE, "status")
    def status(self) -> dict[str, Any]:
        return status_view(self.parts)

    @operation(Op.EXPLAIN, Who.ANYONE, "explain")
    def explain(self, subject: str | None = None) -> dict[str, Any]:
        """Raises :class:`~arbiter.daemon.views.UnknownSubject` (a LookupError) for an unknown subject."""
        return explain_view(self.parts, subject or None)

    @operation(Op.DUTY, Who.ANYONE, "duty")
    def duty(self) -> dict[str, Any]:
        return duty_view(self.parts)

    @operation(Op.TIMELINE, Who.ANYONE, "events")
    def timeline(self, limit: int = 50, subject: str | None = None, code: str | None = None) -> list[dict[str, Any]]:
        return self.parts.store.timeline(max(1, min(limit, 10_000)), subject, code)

    @operation(Op.CERTIFICATES, Who.ANYONE)
    def certificates(self) -> dict[str, Any]:
        view = self.parts.snapshot.view
        return {
            "certificates": list(self.parts.ticker.certificate_states),
            "node": self.parts.ticker.node_fingerprint(),
            "programs": dict(view.rule_exes) if view else {},
        }

    @operation(Op.DOCTOR, Who.ANYONE)
    def doctor(self) -> dict[str, Any]:
        from arbiter.daemon.health import daemon_items

        return {"items": [i.to_dict() for i in daemon_items(self.parts)]}

    @operation(Op.GPU_APIS, Who.ANYONE, "gpu_apis")
    def gpu_apis(self, refresh: bool = False, caller: Caller | None = None) -> dict[str, Any]:
        """The probes' last answer; ``refresh`` runs them again (for an account that is not an
        administrator, at most once a while, so no one can keep them running)."""
        prober = self.parts.prober
        if caller is None:  # the HTTP listener: what is there, never a wait
            return prober.get() or {"pending": True, "host": [], "containers": [], "evidence": {}}
        if refresh:
            answer = prober.refresh(PROBE_WAIT_S, 0.0 if self.is_admin(caller) else PROBE_REFRESH_EVERY_S)
        else:
            answer = prober.get(PROBE_WAIT_S)
        if answer is None:
            raise Refused(f"the GPU API probes have not answered within {PROBE_WAIT_S:g}s; ask again", "BUSY")
        return answer

    @operation(Op.METRICS, Who.ANYONE, "metrics")
    def metrics(self) -> dict[str, Any]:
        """What :func:`arbiter.http.metrics.families` reads for one scrape."""
        p = self.parts
        return {
            "status": status_view(p),
            "duty": duty_view(p),
            "gpu_apis": p.prober.answer,
            "events": dict(p.recorder.counts),
            "latency": p.intake.book.histograms(),
            "costs": p.costs(),
        }

    # --- paired runs ------------------------------------------------------------------------

    @operation(Op.AB_STATUS, Who.ANYONE, "runs")
    def ab_status(self) -> list[dict[str, Any]]:
        from arbiter.daemon.abruns import status

        return status(self.parts)

    @operation(Op.AB_SHOW, Who.ANYONE, "report")
    def ab_show(self, id: str) -> dict[str, Any]:
        """Raises :class:`RunNotFound` (a LookupError) for an unknown run."""
        from arbiter.daemon.abruns import RunRefused, find
        from arbiter.harness.report import report

        try:
            return report(*find(self.parts, id))
        except RunRefused as exc:
            raise RunNotFound(str(exc)) from None

    def ab_plot(self, run_id: str) -> bytes:
        """:data:`Op.AB_SHOW`'s report drawn as a PNG, for the HTTP listener alone (a picture
        is no answer for the socket).  Drawn in a child process (matplotlib would hold the GIL
        from the fast path), and kept while the run has not changed."""
        import json
        import subprocess

        from arbiter.runtime.children import python_module, run_child

        rep = self.ab_show(run_id)
        key = json.dumps([rep["status"], len(rep["blocks"]), len(rep["excluded"])])
        cached = self._plots.get(run_id)
        if cached is not None and cached[0] == key:
            return cached[1]
        done: subprocess.CompletedProcess[bytes] = run_child(
            python_module("arbiter.harness.report"),
            input=json.dumps(rep).encode(),
            capture_output=True,
            timeout=PLOT_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            raise LookupError(f"the plot could not be drawn: {done.stderr.decode(errors='replace')[-300:]}")
        self._plots[run_id] = (key, done.stdout)
        return done.stdout

    def _run_change(self, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        from arbiter.daemon.abruns import RunRefused

        try:
            return fn()
        except RunRefused as exc:
            raise Refused(str(exc), "AB_REFUSED") from None

    def _start(self, settings: dict[str, Any], sweep: bool, caller: Caller, plan_only: bool) -> dict[str, Any]:
        from arbiter.daemon import abruns

        def go() -> dict[str, Any]:
            run_id, sweep_id = abruns.new_ids(sweep)
            run = abruns.spec_from(settings, run_id, sweep_id)
            return abruns.plan(self.parts, run) if plan_only else abruns.start(self.parts, run, caller.uid)

        return self._run_change(go)

    # a run's settings (rule, work, duty, blocks, window, washout, margin, off, max_hours,
    # levels) are checked, with the bounds each has, where the run is made: abruns.spec_from

    @operation(Op.AB_PLAN, Who.ADMIN, "plan")
    def ab_plan(self, caller: Caller, sweep: bool = False, **settings: Any) -> dict[str, Any]:
        """What a paired run would do, checked as a start is, without starting it."""
        return self._start(settings, sweep, caller, plan_only=True)

    @operation(Op.AB_START, Who.ADMIN, "plan")
    def ab_start(self, caller: Caller, sweep: bool = False, **settings: Any) -> dict[str, Any]:
        return self._start(settings, sweep, caller, plan_only=False)

    @operation(Op.AB_SWEEP, Who.ADMIN, "plan")
    def ab_sweep(self, caller: Caller, **settings: Any) -> dict[str, Any]:
        return self._start(settings, True, caller, plan_only=False)

    @operation(Op.AB_ABORT, Who.ADMIN)
    def ab_abort(self, caller: Caller, id: str) -> dict[str, Any]:
        from arbiter.daemon import abruns

        return self._run_change(lambda: abruns.abort(self.parts, id, caller.uid))

    # --- node-wide changes ------------------------------------------------------------------

    @operation(Op.RELOAD, Who.ADMIN)
    def reload(self) -> dict[str, Any]:
        """Read the rule files again at once."""
        self.parts.ticker.reload()
        return {}

    # --- jobs -------------------------------------------------------------------------------

    def _process(self, pid: int) -> ProcessInfo:
        try:
            table = self.parts.ticker.observer.process_table()
        except PluginFailed as exc:
            raise Refused(f"cannot read the process table: {exc}", "PLUGIN_FAILED") from None
        for p in table:
            if p.pid == pid:
                return p
        raise Refused(f"process {pid} does not exist", "NO_SUCH_PROCESS")

    @staticmethod
    def _job_answer(record: JobRecord) -> dict[str, Any]:
        return {"id": record.id, "control_path": record.control_path, "events_path": record.events_path}

    @operation(Op.JOB_REGISTER, Who.ANYONE)
    def job_register(
        self, caller: Caller, cmd: list[str], manifest: dict[str, Any] | None = None, launcher_pid: int = 0
    ) -> dict[str, Any]:
        """A job the caller launches: it becomes the caller's, within the caller's quotas."""
        p = self.parts
        try:
            parsed = Manifest.model_validate(manifest or {})
        except ValidationError as exc:
            raise Refused(f"invalid job manifest: {exc}", "BAD_MANIFEST") from None
        over = job_quota_problem(p.config.quotas, p.jobs, caller.uid, cmd)
        if over:
            raise Refused(over, "QUOTA")
        # the launcher is the caller itself: its pid comes from the socket, not from the request
        launcher = caller.pid or launcher_pid
        warnings: list[str] = []
        if parsed.gpu_for(p.jobs.platform).apis_any:
            provided = p.prober.get(PROBE_WAIT_S)
            if provided is None:  # never judged against an answer not there yet
                raise Refused(f"the GPU API probes have not answered within {PROBE_WAIT_S:g}s; run it again", "BUSY")
            why, warnings = placement(parsed, p.jobs.platform, provided)
            if why is not None:
                raise Refused(
                    f"this host cannot run job {parsed.name!r}: {why}; health: undetected (not an alert)",
                    codes.GPU_API_UNAVAILABLE,
                )
        try:
            record = p.jobs.register(caller.uid, parsed, cmd, launcher, self._process(launcher).start_time)
        except OSError as exc:  # a jobs folder that is not plainly the daemon's own, a full disk
            raise Refused(
                f"cannot make the folder of job {parsed.name!r} in {p.jobs.jobs_dir}: {exc.strerror or exc}; "
                "`arbiter doctor` and the daemon's log say more",
                "STATE_DIR",
            ) from None
        p.jobs_changed()
        p.recorder.flush()  # answered once on disk: a daemon killed right after still knows the job
        return {"job": self._job_answer(record), "warnings": warnings}

    @operation(Op.JOB_ADOPT, Who.PROCESS_OWNER)
    def job_adopt(self, caller: Caller, id: str, pid: int, manifest: dict[str, Any] | None = None) -> dict[str, Any]:
        """A running process handed over by an outside scheduler's hook (see
        :mod:`arbiter.daemon.adopt`): only root, the daemon's user, or the process's own user
        for itself or its parent, under an id of its own or a free one that its scheduler, if
        any, says is the caller's."""
        from arbiter.daemon import adopt

        try:
            adopt.check_id(id)
            parsed = adopt.parse_manifest(id, manifest)
            proc = self._process(pid)
            peer = None
            if caller.pid:
                try:
                    peer = self._process(caller.pid)
                except Refused:
                    peer = None
            why = adopt.may_hand_over(caller.uid, peer, proc, self.parts.uid) or adopt.may_take_id(
                self.parts, id, caller.uid
            )
            if why is not None:
                raise Refused(f"job.adopt: {why}", "FORBIDDEN")
            known = self.parts.jobs.get(id)
            again = known is not None and known.owner_uid == proc.uid and known.state != "ended"
            # a job handed over counts as one registered: within the account's quotas
            over = None if again else job_quota_problem(self.parts.config.quotas, self.parts.jobs, caller.uid, [])
            if over:
                raise Refused(f"job.adopt: {over}", "QUOTA")
            record, new = adopt.adopt(self.parts, id, proc, parsed, f"handed over by process {caller.pid}")
        except adopt.AdoptRefused as exc:
            raise Refused(str(exc), exc.code) from None
        return {"job": self._job_answer(record), "new": new}

    def _verdict(self, job_id: str) -> dict[str, Any]:
        decision = self.parts.snapshot.decision
        verdict = decision.jobs.get(job_id) if decision else None
        record = self.parts.jobs.get(job_id)
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

    @operation(Op.JOB_WAIT, Who.JOB_OWNER)
    def job_wait(self, job: JobRecord, timeout: float = 1.0) -> dict[str, Any]:
        """The job's verdict once it is admitted, or after ``timeout`` (at most :data:`MAX_WAIT_S`)."""
        jobs = self.parts.jobs
        deadline = time.monotonic() + max(0.0, min(timeout, MAX_WAIT_S))
        with jobs.changed:
            while True:
                answer = self._verdict(job.id)
                remaining = deadline - time.monotonic()
                if answer["admitted"] or remaining <= 0:
                    return answer
                jobs.changed.wait(remaining)

    @operation(Op.JOB_STARTED, Who.JOB_OWNER)
    def job_started(self, job: JobRecord, pid: int) -> dict[str, Any]:
        if job.root_pid is not None:
            raise Refused(f"job {job.id} has started already (process {job.root_pid})", "BAD_REQUEST")
        proc = self._process(pid)
        # only a child of the job's own launcher, running as the job's owner, can become the
        # job: otherwise a caller could have arbiter pause or end any process
        if proc.ppid != job.launcher_pid or proc.uid != job.owner_uid:
            raise Refused(
                f"process {proc.pid} is not a child of job {job.id}'s launcher running as uid {job.owner_uid}",
                "FORBIDDEN",
            )
        self.parts.jobs.update(job.id, root_pid=proc.pid, root_start=proc.start_time, state="running")
        self.parts.jobs_changed()
        self.parts.recorder.flush()  # as for the registration: the process to resume after a crash is on disk
        return {}

    @operation(Op.JOB_EXITED, Who.JOB_OWNER)
    def job_exited(self, job: JobRecord, exit_code: int | None = None) -> dict[str, Any]:
        self.parts.ticker.end_job(job, exit_code, f"its command exited with {exit_code}")
        return {}

    @operation(Op.JOB_STOP, Who.JOB_OWNER, by_name=True)
    def job_stop(self, job: JobRecord) -> dict[str, Any]:
        if job.root_pid is None:
            self.parts.ticker.end_job(job, None, "stopped by its owner before it started")
            did = "stopped before it started"
        else:
            self.parts.jobs.update(job.id, stop_requested=time.time())
            did = "asked to stop: its control document says stop, and it is terminated after stop_grace_s"
        self.parts.jobs_changed()
        return {"job": job.id, "did": did}

    @operation(Op.JOB_PAUSE, Who.JOB_OWNER, by_name=True)
    def job_pause(self, job: JobRecord) -> dict[str, Any]:
        was = job.user_hold
        self.parts.jobs.update(job.id, user_hold=True)
        self.parts.jobs_changed()
        return {"job": job.id, "did": "already held by you" if was else "held by you until `arbiter job resume`"}

    @operation(Op.JOB_RESUME, Who.JOB_OWNER, by_name=True)
    def job_resume(self, job: JobRecord) -> dict[str, Any]:
        was = job.user_hold
        self.parts.jobs.update(job.id, user_hold=False)
        self.parts.jobs_changed()
        did = "your hold is lifted (arbiter's own holds stay: `arbiter explain`)" if was else "was not held by you"
        return {"job": job.id, "did": did}
