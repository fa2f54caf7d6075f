"""``slurm``: a pause the scheduler can see.

For a Slurm job (arbiter job ``slurm-<id>...``): pause stops the job's processes here at once
with SIGSTOP, as the ``signal`` translator does (Slurm itself stops a job only about two
seconds after its SIGTSTP), then tells Slurm: ``scontrol suspend`` (the job shows ``S`` in
squeue and its time limit stops counting).  Resume is ``scontrol resume``, then SIGCONT here.
Stop is ``scontrol requeue`` for a job that may be requeued (``sbatch --requeue``; a
suspended job is resumed first, so that it gets the grace Slurm gives it, never a bare
SIGKILL) followed by ``StartTime=now+2`` so it is placed again in seconds; a job that may not be
requeued is ended here with SIGTERM, as by the ``signal`` translator.  Other jobs are paused
and ended with signals alone.

The Slurm commands run in order on one thread of the translator's own, so a decision never
waits for slurmctld; one that fails is logged and the local pause stands (fail safe: the job
stays stopped here).  A Slurm job's kill (a stop's grace ended) waits on that thread behind
its requeue: a SIGKILL sent first would end the job rather than requeue it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from arbiter.plugin import JobTarget, KindOptions, PluginContext, ProcessRef
from arbiter_slurm import commands
from arbiter_translators.signals import SignalTranslator

log = logging.getLogger(__name__)

Op = Literal["suspend", "resume", "requeue", "kill"]
#: how long a requeued job may take to finish completing before it is placed again at once
REQUEUE_SETTLE_S = 30.0
#: slurmd refuses a job's new start whose credential is dated no later than the second its
#: last run was revoked in (the requeue): the job would end at once, "Job credential revoked"
CREDENTIAL_CLEAR_S = 2


class SlurmOptions(KindOptions):
    kind: Literal["slurm"] = "slurm"


@dataclass(frozen=True)
class _Work:
    op: Op
    job: str
    refs: tuple[ProcessRef, ...] = ()
    target: JobTarget | None = None


def slurm_job(job_id: str) -> str | None:
    """The Slurm job id of an arbiter job id (``slurm-17``, ``slurm-17.0.1``), else None."""
    if not job_id.startswith("slurm-"):
        return None
    number = job_id.removeprefix("slurm-").split(".", 1)[0]
    return number if commands.valid_job_id(number) else None


def job_of_process(pid: int) -> str | None:
    """The Slurm job a process runs in, from its environment (resumes after a daemon restart
    name processes only)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = fh.read().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"SLURM_JOB_ID="):
            value = item.split(b"=", 1)[1].decode(errors="replace")
            return value if commands.valid_job_id(value) else None
    return None


class SlurmTranslator(SignalTranslator):
    Options = SlurmOptions  # type: ignore[assignment]
    actions = frozenset({"pause", "resume", "terminate", "kill"})
    bounded = True  # signals here; Slurm's commands wait on the translator's own thread
    rank = 30  # after the local ones: it serves where it is named or they are not available

    def __init__(self, options: SlurmOptions, context: PluginContext) -> None:
        super().__init__(options, context)  # type: ignore[arg-type]
        self._lock = threading.Lock()
        self._paused: dict[ProcessRef, str] = {}  # a paused process → its Slurm job
        self._work: queue.Queue[_Work | None] = queue.Queue()
        self._thread: threading.Thread | None = None  # started with its first work

    def _put(self, work: _Work) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="slurm translator", daemon=True)
                self._thread.start()
        self._work.put(work)

    def available(self) -> tuple[bool, str]:
        ok, why = super().available()
        if not ok:
            return ok, why
        if not commands.configured(commands.options(self.context)):
            return False, "Slurm is not installed or configured here (no squeue/scontrol, or no slurm.conf)"
        return True, ""

    def close(self) -> None:
        with self._lock:
            thread = self._thread
        if thread is not None:
            self._work.put(None)
            thread.join(timeout=commands.TIMEOUT_S * 3)

    def pause(self, target: JobTarget) -> list[ProcessRef]:
        paused = super().pause(target)
        job = slurm_job(target.job_id)
        if job is not None:
            with self._lock:
                self._paused.update(dict.fromkeys(paused, job))
            self._put(_Work("suspend", job))
        return paused

    def resume(self, refs: Sequence[ProcessRef]) -> None:
        jobs: dict[str, list[ProcessRef]] = {}
        with self._lock:
            for ref in refs:
                job = self._paused.pop(ref, None) or job_of_process(ref.pid)
                if job is not None:
                    jobs.setdefault(job, []).append(ref)
        super().resume(refs)
        for job, mine in jobs.items():
            # Slurm stops a suspended job's processes again until it is told: continued
            # once more after it has been
            self._put(_Work("resume", job, tuple(mine)))

    def terminate(self, target: JobTarget) -> None:
        job = slurm_job(target.job_id)
        if job is None:
            super().terminate(target)
            return
        self._put(_Work("requeue", job, target=target))

    def kill(self, target: JobTarget) -> None:
        job = slurm_job(target.job_id)
        if job is None:
            super().kill(target)
            return
        # after its requeue, on the same thread: a SIGKILL that came first would end the job
        # (a slow squeue or scontrol outlasts a short stop_grace_s) instead of requeueing it
        self._put(_Work("kill", job, target=target))

    # --- the Slurm side, in order, on the translator's thread ----------------------------------

    def _run(self) -> None:
        while True:
            work = self._work.get()
            if work is None:
                return
            try:
                self._do(work)
            except commands.SlurmError as exc:
                log.warning("Slurm job %s: %s failed: %s", work.job, work.op, exc)
            except Exception:  # the thread goes on whatever one command met
                log.exception("Slurm job %s: %s failed", work.job, work.op)

    def _do(self, work: _Work) -> None:
        if work.op == "suspend":
            commands.run(["scontrol", "suspend", work.job])
        elif work.op == "resume":
            if self._state(work.job) == "SUSPENDED":
                commands.run(["scontrol", "resume", work.job])
            super().resume(work.refs)
        elif work.op == "kill":
            assert work.target is not None
            super().kill(work.target)
        elif work.op == "requeue":
            assert work.target is not None
            state, requeue = self._job(work.job)
            if not requeue or state not in ("RUNNING", "SUSPENDED"):
                super().terminate(work.target)  # it may not run again: it ends here
                return
            if state == "SUSPENDED":
                commands.run(["scontrol", "resume", work.job])  # the grace of a running job
            super().resume(work.target.processes)
            commands.run(["scontrol", "requeue", work.job])
            self._place_at_once(work.job)

    def _place_at_once(self, job: str) -> None:
        """A requeued job waits a while before it may start again (its BeginTime); once it
        has finished completing here, that wait is shortened to the few seconds slurmd needs
        to accept its new credential (set earlier, completing resets it)."""
        deadline = time.monotonic() + REQUEUE_SETTLE_S
        while self._state(job) != "PENDING":
            if time.monotonic() >= deadline:
                log.info("Slurm job %s requeued; still not pending after %gs: left to Slurm", job, REQUEUE_SETTLE_S)
                return
            time.sleep(0.1)
        try:
            commands.run(["scontrol", "update", f"JobId={job}", f"StartTime=now+{CREDENTIAL_CLEAR_S}"])
        except commands.SlurmError as exc:
            log.info("Slurm job %s requeued; placing it at once failed: %s", job, exc)

    def _job(self, job: str) -> tuple[str, bool]:
        for j in commands.parse_squeue(commands.run(["squeue", "--json", "--jobs", job])):
            if str(j.job_id) == job:
                return j.state, j.requeue
        return "", False

    def _state(self, job: str) -> str:
        return self._job(job)[0]
