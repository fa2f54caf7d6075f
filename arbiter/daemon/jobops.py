"""The operations on jobs: registering one, handing a running process over, and a job's
owner waiting on it, starting, stopping, pausing and resuming it.  A part of the daemon's
table of operations (:class:`arbiter.daemon.api.NodeApi`), declared as the rest of it is."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from arbiter.api.ops import Caller, Op, Who
from arbiter.api.verdict import verdict_mark
from arbiter.config.jobdocs import Manifest
from arbiter.daemon.operation import Refused, may_act_on_job, operation
from arbiter.daemon.quotas import job_quota_problem
from arbiter.engine import codes
from arbiter.plugin import ProcessInfo
from arbiter.pluginmanager import PluginFailed
from arbiter.probing import placement
from arbiter.state.store import JobRecord

if TYPE_CHECKING:
    from arbiter.daemon.parts import Parts

MAX_WAIT_S = 5.0
#: the longest a watcher of a job (``job.wait`` with ``unless``) waits for its verdict to
#: change: each answer is a connection and a thread, and a quiet job's watcher needs none
WATCH_MOST_S = 30.0
#: the longest ``job.adopt`` waits for the decision on the job it took on (the hook that asks
#: waits at most 5 s): a task handed over before it starts is held before its first
#: instruction when its node protects, and where no decision comes this soon it is answered
#: all the same, the decision acting when it comes
ADOPT_DECIDED_S = 3.0
PROBE_WAIT_S = 45.0  # the first run of every probe, on a slow host


class Watchers:
    """The watchers of jobs (``job.wait`` with ``unless``) each account has waiting in the
    daemon.  Each holds one of the account's connections (``quotas.connections_per_uid``)
    while it waits: past a quarter of those an account's watcher is answered at once, and
    asks again a second later, so the account's own commands still find a connection."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[int, int] = {}

    def enter(self, uid: int, most: int) -> bool:
        """One more of ``uid``'s watchers waits, if fewer than ``most`` do."""
        with self._lock:
            held = self._waiting.get(uid, 0)
            if held >= most:
                return False
            self._waiting[uid] = held + 1
            return True

    def leave(self, uid: int) -> None:
        with self._lock:
            held = self._waiting.pop(uid, 0) - 1
            if held > 0:
                self._waiting[uid] = held


class JobOperations:
    """What the table does with jobs; it reads and changes them through the job registry
    (which has its own lock) and tells the decision thread."""

    parts: Parts
    watchers: Watchers

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
        # Answered once a decision has acted on the job: a scheduler's hook runs before its
        # task and the task waits for it, so a task paused now is stopped before it execs its
        # program.  Answered at once, the task would start, and fork, before the pause reaches
        # it; the pause stops only the processes known then, its children only a tick later.
        verdict = self._decided(record.id, ADOPT_DECIDED_S) if new else self._verdict(record.id)
        return {"job": self._job_answer(record), "new": new, "verdict": verdict}

    def _decided(self, job_id: str, timeout: float) -> dict[str, Any]:
        """The job's verdict once a decision that saw it has acted, or after ``timeout``.  A
        decision observed after this call began read the registry with the job in it (an
        earlier one may hold a verdict on a job ended under the same id)."""
        jobs = self.parts.jobs
        since = time.monotonic()
        deadline = since + timeout
        with jobs.changed:
            while True:
                snap = self.parts.snapshot
                remaining = deadline - time.monotonic()
                decided = snap.decision is not None and job_id in snap.decision.jobs
                if (decided and snap.obs is not None and snap.obs.now >= since) or remaining <= 0:
                    return self._verdict(job_id)
                jobs.changed.wait(remaining)

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
    def job_wait(
        self, caller: Caller, job: JobRecord, timeout: float | None = None, unless: str | None = None
    ) -> dict[str, Any]:
        """The job's verdict once it is admitted, or after ``timeout`` (1 s unless given; at
        most :data:`MAX_WAIT_S`).  Given ``unless`` (a :func:`verdict_mark`), once the
        verdict's mark is another, or after ``timeout`` (at most, and unless given,
        :data:`WATCH_MOST_S`): a watcher of the job waits here for a change instead of
        asking every second, and is woken only by a decision that changed a verdict."""
        if unless is None or caller.uid in (0, self.parts.uid):
            return self._wait(job, timeout, unless)
        if not self.watchers.enter(caller.uid, self.parts.config.quotas.connections_per_uid // 4):
            return self._verdict(job.id)  # the account's connections are for its commands too
        try:
            return self._wait(job, timeout, unless)
        finally:
            self.watchers.leave(caller.uid)

    def _wait(self, job: JobRecord, timeout: float | None, unless: str | None) -> dict[str, Any]:
        jobs = self.parts.jobs
        most = MAX_WAIT_S if unless is None else WATCH_MOST_S
        default = 1.0 if unless is None else WATCH_MOST_S
        deadline = time.monotonic() + max(0.0, min(default if timeout is None else timeout, most))
        woken_by = jobs.changed if unless is None else jobs.verdicts
        with woken_by:
            while True:
                answer = self._verdict(job.id)
                remaining = deadline - time.monotonic()
                done = answer["admitted"] if unless is None else verdict_mark(answer) != unless
                if done or remaining <= 0:
                    return answer
                woken_by.wait(remaining)

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
