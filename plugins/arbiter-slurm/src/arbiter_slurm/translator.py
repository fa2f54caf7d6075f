"""``slurm``: a pause the scheduler can see.

For a Slurm job (arbiter job ``slurm-<id>...``, ``slurm-<array job>_<task>`` for a task of an
array): pause stops the job's processes here at once with SIGSTOP, as the ``signal``
translator does (Slurm itself stops a job only about two seconds after its SIGTSTP), then
tells Slurm: ``scontrol suspend`` (the job shows ``S`` in squeue and its time limit stops
counting).  Resume is ``scontrol resume``, then SIGCONT here; a job that also runs on other
nodes is resumed in Slurm only once every one of them that runs arbiter admits GPU work
(``arbiter-admit``): the last node to let it go resumes it.

A node that still protects keeps the job stopped here whatever happens elsewhere: while it
holds a Slurm job paused, a watcher looks at the paused processes every few milliseconds, and
one found running again (Slurm continued the job: another of its nodes, an operator) is
stopped at once, the job suspended in Slurm again, and the timeline says so.  The daemon and
its reflex process each have an instance, and either may resume what the other paused: the
pause marks they share (:mod:`arbiter_slurm.marks`) say which processes are held, and for
which Slurm job.

Stop is a requeue for a job that may be requeued (``sbatch --requeue``): the job is given its
checkpoint signal (the evicting rule's ``eviction.checkpoint_signal``, else
``slurm.checkpoint_signal``, else its own ``#SBATCH --signal``) and at most ``checkpoint_s``
(the rule's, else the node's) to save its work, then ``scontrol requeue`` (not for a job that
requeued itself once saved: the wait ends there, and it is placed again all the same); its processes here get
``slurm.requeue_grace_s`` to end on Slurm's SIGTERM before they are killed, and it is placed
again within a second or two (``StartTime=now``, once slurmd takes its new start).  A job that
may not be requeued is ended here with SIGTERM, as by the ``signal`` translator.  Other jobs are paused and ended with signals alone.

The Slurm commands run on threads of the translator's own, one lane per Slurm job: a job's
commands run in order, different jobs' at the same time (three jobs evicted at once are each
requeued as soon as one would be), and a decision never waits for slurmctld.  One that fails
is logged and the local pause stands (fail safe: the job stays stopped here).  A job that is
pending or has ended by the time a command reaches Slurm has nothing to resume or requeue:
that is no failure.  A Slurm job's kill (a stop's grace ended) waits in its lane behind its
requeue: a SIGKILL sent first would end the job rather than requeue it.

The module runs past 400 lines because the pause, the re-stop watcher, the lanes and the
requeue share one record of paused processes and its lock; split, each part would reach into
the others' state.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from arbiter.plugin import JobTarget, KindOptions, PluginContext, ProcessRef
from arbiter_slurm import commands, nodes, settings
from arbiter_slurm.marks import PauseMarks
from arbiter_slurm.slurmjob import (
    checkpoint_of,
    credential_wait,
    job_of_process,
    nothing_to_do,
    running,
    slurm_job,
)
from arbiter_translators.signals import PLAIN_PAUSE, SignalTranslator

log = logging.getLogger(__name__)

Op = Literal["suspend", "resume", "requeue", "kill", "restopped"]
#: how long a requeued job may take to finish completing before it is placed again at once
REQUEUE_SETTLE_S = 30.0
#: how often a requeued job is asked whether it is pending (its Epilog done): one ``squeue
#: --jobs`` of one job each time
SETTLE_POLL_S = 0.1
#: how often the watcher looks at the processes of paused Slurm jobs
WATCH_S = 0.01
#: ... while it holds none (a job paused a moment ago is not continued by Slurm that soon)
IDLE_WATCH_S = 0.1
#: how long a process just paused may take to stop before one seen running is said to have run again
SETTLED_S = 0.5
#: how long slurmd may take to resume a job here after ``scontrol resume`` before its
#: checkpoint signal is sent anyway, and how often its processes are looked at meanwhile
RESUMED_S = 2.0
RESUMED_POLL_S = 0.01
#: how often a job given its checkpoint signal is asked whether it still runs
CHECKPOINT_POLL_S = 0.25
#: the timeline code of a paused job's process found running again, and stopped
RESTOPPED = "SLURM_JOB_RESTOPPED"
#: the timeline code of a job run again here and left suspended in Slurm for its other nodes
DEFERRED = "SLURM_RESUME_DEFERRED"


class SlurmOptions(KindOptions):
    kind: Literal["slurm"] = "slurm"


@dataclass(frozen=True)
class _Work:
    op: Op
    job: str
    refs: tuple[ProcessRef, ...] = ()
    target: JobTarget | None = None


@dataclass
class _Lane:
    """One Slurm job's commands, in order; a thread runs them while there are any."""

    queue: list[_Work] = field(default_factory=list)
    busy: bool = False


class SlurmTranslator(SignalTranslator):
    Options = SlurmOptions  # type: ignore[assignment]
    actions = frozenset({"pause", "resume", "terminate", "kill"})
    bounded = True  # signals here; Slurm's commands wait on the translator's own threads
    rank = 30  # after the local ones: it serves where it is named or they are not available

    def __init__(self, options: SlurmOptions, context: PluginContext) -> None:
        super().__init__(options, context)  # type: ignore[arg-type]
        self._lock = threading.Lock()
        self._paused: dict[ProcessRef, tuple[str, str]] = {}  # a paused process → (Slurm job, arbiter job)
        self._paused_at: dict[ProcessRef, float] = {}  # ... when it was paused (monotonic)
        self._lanes: dict[str, _Lane] = {}
        self._closed = threading.Event()
        self._watching: threading.Thread | None = None  # started with the first pause
        self._marks = PauseMarks(context.state_dir)  # shared with the node's other instances
        self._marks.sweep()

    @property
    def opts(self) -> settings.NodeOptions:
        return settings.options(self.context)

    def available(self) -> tuple[bool, str]:
        ok, why = super().available()
        if not ok:
            return ok, why
        if not settings.configured(self.opts):
            return False, "Slurm is not installed or configured here (no squeue/scontrol, or no slurm.conf)"
        return True, ""

    def close(self) -> None:
        self._closed.set()
        deadline = time.monotonic() + commands.TIMEOUT_S * 3
        while time.monotonic() < deadline:
            with self._lock:
                if not any(lane.busy for lane in self._lanes.values()):
                    return
            time.sleep(0.05)

    def pause_effect(self, refs: Sequence[ProcessRef]) -> str:
        o = self.opts
        sig = o.checkpoint_signal or "its own #SBATCH --signal, if it gives one,"
        return (
            f"{PLAIN_PAUSE}; the Slurm job is suspended (S in squeue). Evicted, a job that may be requeued is "
            f"given {sig} and at most {o.checkpoint_s:g}s to save its work (the evicting rule's eviction: settings "
            "first, where it has them), then requeued; its processes here "
            f"are killed {o.requeue_grace_s:g}s after Slurm's SIGTERM (at most "
            f"{o.checkpoint_s + o.requeue_grace_s:g}s running here in all)"
        )

    def pause(self, target: JobTarget) -> list[ProcessRef]:
        paused = super().pause(target)
        job = slurm_job(target.job_id)
        # suspended in Slurm only with processes paused here: a resume undoes the suspend only
        # through them (a target that names none of the job's processes pauses nothing)
        if job is not None and paused:
            self._marks.put(paused, job)
            with self._lock:
                self._paused.update(dict.fromkeys(paused, (job, target.job_id)))
                self._paused_at.update(dict.fromkeys(paused, time.monotonic()))
                if self._watching is None:
                    self._watching = threading.Thread(target=self._watch, name="slurm re-stop", daemon=True)
                    self._watching.start()
            self._put(_Work("suspend", job))
        return paused

    def resume(self, refs: Sequence[ProcessRef]) -> None:
        jobs: dict[str, list[ProcessRef]] = {}
        with self._lock:
            for ref in refs:
                self._paused_at.pop(ref, None)
                job = self._paused.pop(ref, (None, ""))[0] or self._marks.job(ref) or job_of_process(ref.pid)
                if job is not None:
                    jobs.setdefault(job, []).append(ref)
        # before they run again: the instance that paused them sees them running unmarked
        self._marks.drop(refs)
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
        with self._lock:  # its stop continues it: no longer a pause to keep
            for ref in target.processes:
                self._paused.pop(ref, None)
                self._paused_at.pop(ref, None)
        self._marks.drop(target.processes)
        self._put(_Work("requeue", job, target=target))

    def kill(self, target: JobTarget) -> None:
        job = slurm_job(target.job_id)
        if job is None:
            super().kill(target)
            return
        # after its requeue, in its lane: a SIGKILL that came first would end the job (a
        # slow squeue or scontrol outlasts a short stop_grace_s) instead of requeueing it
        self._put(_Work("kill", job, target=target))

    # --- the watcher: a paused job stays stopped here --------------------------------------------

    def _watch(self) -> None:
        paused: list[tuple[ProcessRef, tuple[str, str]]] = []
        while not self._closed.wait(WATCH_S if paused else IDLE_WATCH_S):
            with self._lock:
                paused = list(self._paused.items())
            woken: dict[str, list[int]] = {}
            for ref, (job, key) in paused:
                if running(ref.pid):
                    if not self._marks.held(ref):  # another instance resumed it: its resume stands
                        with self._lock:
                            self._paused.pop(ref, None)
                            self._paused_at.pop(ref, None)
                        continue
                    try:
                        stopped = self._send_all([ref], signal.SIGSTOP, "pause", None, key)
                    except Exception as exc:  # the next look tries again
                        log.warning("Slurm job %s: cannot stop pid %d again: %s", job, ref.pid, exc)
                        continue
                    with self._lock:
                        still = self._paused.get(ref) is not None and self._marks.held(ref)
                        # one paused a moment ago may not have stopped yet: stopped again, not said
                        settled = time.monotonic() - self._paused_at.get(ref, 0.0) >= SETTLED_S
                    if stopped and still and settled:
                        woken.setdefault(f"{job}\0{key}", []).append(ref.pid)
                    elif stopped and not still:  # resumed by arbiter meanwhile: its own resume stands
                        super().resume([ref])
            for both, pids in woken.items():
                job, key = both.split("\0")
                self._put(_Work("restopped", job, tuple(ProcessRef(p, 0.0) for p in pids), JobTarget(key, key, ())))

    # --- the Slurm side, one lane per job, on threads of their own -----------------------------

    def _put(self, work: _Work) -> None:
        with self._lock:
            lane = self._lanes.setdefault(work.job, _Lane())
            lane.queue.append(work)
            if lane.busy:
                return
            lane.busy = True
        threading.Thread(target=self._run, args=(work.job,), name=f"slurm job {work.job}", daemon=True).start()

    def _run(self, job: str) -> None:
        while True:
            with self._lock:
                lane = self._lanes[job]
                if not lane.queue:
                    lane.busy = False
                    del self._lanes[job]
                    return
                work = lane.queue.pop(0)
            try:
                self._do(work)
            except commands.SlurmError as exc:
                if nothing_to_do(exc):
                    log.info("Slurm job %s: %s: nothing to do (%s)", work.job, work.op, exc)
                else:
                    log.warning("Slurm job %s: %s failed: %s", work.job, work.op, exc)
            except Exception:  # the lane goes on whatever one command met
                log.exception("Slurm job %s: %s failed", work.job, work.op)

    def _do(self, work: _Work) -> None:
        if work.op == "suspend":
            commands.run(["scontrol", "suspend", work.job])
        elif work.op == "resume":
            self._resume(work)
        elif work.op == "restopped":
            self._restopped(work)
        elif work.op == "kill":
            assert work.target is not None
            super().kill(work.target)
        elif work.op == "requeue":
            assert work.target is not None
            self._requeue(work.job, work.target)

    def _resume(self, work: _Work) -> None:
        job = self._job(work.job)
        if job is not None and job.state == "SUSPENDED":
            held = self._held_elsewhere(job)
            if held:
                self._say(
                    work,
                    DEFERRED,
                    f"Slurm job {work.job} runs here again but stays suspended in Slurm: {', '.join(held)} "
                    "still hold(s) GPU work; the last of its nodes to let it go resumes it",
                    {"slurm_job": work.job, "held_on": held},
                )
            else:
                commands.run(["scontrol", "resume", work.job])
        with self._lock:  # a process paused again meanwhile stays stopped
            mine = [r for r in work.refs if r not in self._paused]
        super().resume(mine)

    def _say(self, work: _Work, code: str, message: str, data: dict[str, Any]) -> None:
        """A line on the timeline, for the arbiter job the work is for."""
        log.info("%s", message)
        note = self.context.note
        if note is not None:
            job_id = work.target.job_id if work.target is not None else ""
            if not job_id and work.refs:
                data = {**data, "pid": work.refs[0].pid}  # the daemon's paused set knows whose it was
            note(job_id, code, message, data)

    def _held_elsewhere(self, job: commands.SlurmJob) -> list[str]:
        """The other nodes of the job that run arbiter and do not admit GPU work now."""
        here = settings.node_name(self.opts)
        held = []
        for name in commands.expand_hostlist(job.nodes):
            if name == here:
                continue
            try:
                view = nodes.read_node(name)
            except commands.SlurmError as exc:
                log.info("Slurm job %s: cannot read node %s (%s); it does not hold the job", job.key, name, exc)
                continue
            if "arbiter" in view.available and nodes.ADMIT not in view.active:
                held.append(name)
        return held

    def _restopped(self, work: _Work) -> None:
        assert work.target is not None
        job = self._job(work.job)
        state = job.state if job is not None else "gone"
        others = [n for n in commands.expand_hostlist(job.nodes) if n != settings.node_name(self.opts)] if job else []
        who = (
            f"Slurm continued the job (state {state}: `scontrol resume` from "
            f"{'another of its nodes, ' + ', '.join(others) + ', or ' if others else ''}an operator)"
        )
        pids = [r.pid for r in work.refs]
        self._say(
            work,
            RESTOPPED,
            f"process(es) {', '.join(map(str, pids))} of paused job {work.target.job_id} ran again: {who}; "
            "stopped again at once, protection still holds them here",
            {"pids": pids, "slurm_job": work.job, "slurm_state": state, "nodes": others},
        )
        if state == "RUNNING":
            commands.run(["scontrol", "suspend", work.job])  # S in squeue again: it cannot run partly

    def _requeue(self, key: str, target: JobTarget) -> None:
        job = self._job(key)
        if job is None or not job.requeue or job.state not in ("RUNNING", "SUSPENDED"):
            super().terminate(target)  # it may not run again, or has no run left: it ends here
            return
        opts = self.opts
        sig, most_s = checkpoint_of(target, opts, key)
        if job.state == "SUSPENDED":  # it runs to save its work and end
            # stopped here until slurmd continues it: that says slurmd has resumed it
            self._send_all(target.processes, signal.SIGSTOP, "pause", None, target.job_id)
            commands.run(["scontrol", "resume", key])
            self._resumed_by_slurm(target)
        super().resume(target.processes)
        if sig is not None and most_s > 0:
            self._checkpoint(key, sig, target, most_s)
        if not self._requeued_since(key, job.restart_count):
            try:
                commands.run(["scontrol", "requeue", key])
            except commands.SlurmError as exc:
                if not self._requeued_since(key, job.restart_count):  # (else: it did so meanwhile)
                    if not nothing_to_do(exc):
                        raise
                    log.info("Slurm job %s: not requeued, it is pending or has ended (%s)", key, exc)
                    return
        requeued_by = time.time()  # slurmctld has dated its revoke by now
        self._end_here(target, opts.requeue_grace_s)
        self._place_at_once(key, requeued_by)

    def _requeued_since(self, key: str, restarts: int) -> bool:
        """Whether the job has been requeued since it had ``restarts`` (it requeued itself once
        its work was saved: ``scontrol requeue $SLURM_JOB_ID`` in its signal's trap).  Such a
        job is not requeued again, but it is placed again at once like one the node requeued:
        left to Slurm, it would wait out Slurm's own delay for a requeued job (minutes)."""
        job = self._job(key)
        return job is not None and job.restart_count > restarts

    def _resumed_by_slurm(self, target: JobTarget) -> None:
        """Wait (at most ``RESUMED_S``) until slurmd has resumed the job here: slurmctld answers
        ``scontrol resume`` before slurmd has, and a signal that reaches a job's step while it
        is still suspended is dropped (a checkpoint signal lost, the job's work with it).
        slurmd continues the job's processes as it resumes it: one of them, stopped here just
        before, seen running says it has."""
        deadline = time.monotonic() + RESUMED_S
        while time.monotonic() < deadline:
            if any(running(r.pid) for r in target.processes) or not any(
                os.path.exists(f"/proc/{r.pid}") for r in target.processes
            ):
                return
            time.sleep(RESUMED_POLL_S)
        log.info(
            "Slurm job %s: not seen resumed here within %gs; its checkpoint signal may be lost",
            target.job_id,
            RESUMED_S,
        )

    def _checkpoint(self, key: str, sig: commands.CheckpointSignal, target: JobTarget, most_s: float) -> None:
        """Give the job its checkpoint signal, and wait while it saves: at most ``most_s``,
        less when it ends or leaves the running state (it requeued itself) sooner."""
        try:
            commands.run(sig.scancel(key))
        except commands.SlurmError as exc:
            log.warning("Slurm job %s: its checkpoint signal %s was not sent: %s", key, sig, exc)
            return
        log.info("Slurm job %s: sent %s, up to %gs to save its work", key, sig, most_s)
        deadline = time.monotonic() + most_s
        while time.monotonic() < deadline:
            if not any(running(r.pid) for r in target.processes):
                return
            job = self._job(key)
            if job is None or job.state != "RUNNING":
                return
            time.sleep(min(CHECKPOINT_POLL_S, max(0.0, deadline - time.monotonic())))

    def _end_here(self, target: JobTarget, grace_s: float) -> None:
        """The job's processes here end on Slurm's SIGTERM within ``grace_s``, or are killed."""
        deadline = time.monotonic() + grace_s
        while any(os.path.exists(f"/proc/{r.pid}") and running(r.pid) for r in target.processes):
            if time.monotonic() >= deadline:
                super().kill(target)
                return
            time.sleep(0.05)

    def _place_at_once(self, key: str, requeued_by: float) -> None:
        """A requeued job waits a while before it may start again (the BeginTime Slurm gives a
        requeued job); once it has finished completing (its Epilog done on every node: Slurm
        sets that BeginTime only then, ``batch_requeue_fini`` in job_mgr.c, so an update made
        before is undone), that wait is ended, as soon as slurmd accepts its new credential
        (:func:`credential_wait`: usually at once, its Epilog took longer).  An update of a job
        that may start has it placed at once, not at slurmctld's next scheduling pass."""
        deadline = time.monotonic() + REQUEUE_SETTLE_S
        while (job := self._job(key)) is None or job.state != "PENDING":
            if time.monotonic() >= deadline:
                log.info("Slurm job %s requeued; still not pending after %gs: left to Slurm", key, REQUEUE_SETTLE_S)
                return
            time.sleep(SETTLE_POLL_S)
        time.sleep(credential_wait(requeued_by, time.time()))
        try:
            if (job := self._job(key)) is not None and job.state == "PENDING":
                commands.run(["scontrol", "update", f"JobId={key}", "StartTime=now"])
        except commands.SlurmError as exc:
            log.info("Slurm job %s requeued; placing it at once failed: %s", key, exc)

    def _job(self, key: str) -> commands.SlurmJob | None:
        for j in commands.parse_squeue(commands.run(["squeue", "--json", "--jobs", key])):
            if j.key == key:
                return j
        return None
