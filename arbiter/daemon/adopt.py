"""Jobs an outside scheduler started: adopted as they run, and reconciled with what the
scheduler says runs here.

A scheduler's hook (run as the job's user just before its task starts) hands the daemon the
task's process; the daemon makes it a job that is running already, with the id the scheduler
gives it (``<scheduler>-<job id>``), so that ``arbiter explain`` and the status name the
scheduler's job.  Hooks can be missed (the daemon restarting, a hook's call timing out), so
the tick also asks ``arbiter_scheduler_jobs`` what runs here and adopts what it does not know.
The scheduler's word wins: a job under its id with another owner or process is ended first.
Only root and the daemon's account speak for the scheduler: any other account hands over
its own process under an id of its own or a free one, and under a scheduler's id only when
that scheduler says the job is the account's (``arbiter_scheduler_job_owner``).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from arbiter.config.jobdocs import Manifest
from arbiter.engine import codes
from arbiter.plugin import ProcessInfo
from arbiter.pluginmanager import PluginFailed
from arbiter.pluginsteps import Step, Steps

if TYPE_CHECKING:
    from arbiter.daemon.parts import Parts
    from arbiter.state.store import JobRecord

log = logging.getLogger(__name__)

#: how often the tick asks the schedulers what runs here (besides at start)
RECONCILE_EVERY_S = 5.0
#: an adopted job's id: the scheduler's name, a dash, its own job (and step) id
ID_PATTERN = re.compile(r"^[a-z][a-z0-9]*-[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")


class AdoptRefused(Exception):
    def __init__(self, message: str, code: str = "BAD_REQUEST") -> None:
        self.code = code
        super().__init__(message)


@dataclass(frozen=True)
class SchedulerJob:
    """One job (or one task of it) that a scheduler runs on this node."""

    id: str
    uid: int
    pid: int
    manifest: dict[str, Any] | None = None


def default_manifest(job_id: str) -> dict[str, Any]:
    """What a scheduler's job declares when it declares nothing: shared GPU work, named after
    its scheduler (trust is kept per name)."""
    return {"name": job_id.split("-", 1)[0], "gpu": {"use": "shared"}}


def parse_manifest(job_id: str, raw: dict[str, Any] | None) -> Manifest:
    try:
        return Manifest.model_validate(raw if raw else default_manifest(job_id))
    except ValidationError as exc:
        raise AdoptRefused(f"job {job_id}: invalid job manifest: {exc}", "BAD_MANIFEST") from None


def check_id(job_id: str) -> None:
    if not ID_PATTERN.fullmatch(job_id):
        raise AdoptRefused(
            f"{job_id!r} is not a scheduler job id: expected <scheduler>-<id>, e.g. batch-1234 "
            "(lower-case letters and digits, a dash, then letters, digits, _ . + -)"
        )


def adopt(daemon: Parts, job_id: str, proc: ProcessInfo, manifest: Manifest, why: str) -> tuple[JobRecord, bool]:
    """Make ``proc`` the running job ``job_id``; (the record, whether it is new).

    Asking again for the same process returns the job it is already; an active job with this
    id and another process or owner is ended first (the caller vouches for ``proc``)."""
    check_id(job_id)
    existing = daemon.jobs.get(job_id)
    if existing is not None and existing.state != "ended":
        if existing.rooted_at(proc.pid, proc.start_time) and existing.owner_uid == proc.uid:
            return existing, False
        daemon.ticker.end_job(existing, None, f"{job_id} is now process {proc.pid} of uid {proc.uid} ({why})")
    record = daemon.jobs.adopt(job_id, proc.uid, manifest, proc.pid, proc.start_time)
    daemon.recorder.event(
        codes.JOB_ADOPTED,
        job_id,
        f"job {job_id} adopted: process {proc.pid} of uid {proc.uid}, already running ({why})",
        {"pid": proc.pid, "uid": proc.uid, "name": manifest.name},
    )
    daemon.jobs_changed()
    return record, True


def may_hand_over(peer_uid: int, peer: ProcessInfo | None, proc: ProcessInfo, daemon_uid: int) -> str | None:
    """Why the caller may not make ``proc`` a job (None: it may).  Root and the daemon's user
    may name any process; anyone else only their own, and only itself or its parent (a
    scheduler's task hook is a child of the task it runs before)."""
    if peer_uid in (0, daemon_uid):
        return None
    if proc.uid != peer_uid:
        return f"process {proc.pid} runs as uid {proc.uid}, not as the caller's uid {peer_uid}"
    if peer is None or proc.pid not in (peer.pid, peer.ppid):
        return f"process {proc.pid} is neither the caller nor the caller's parent"
    return None


def may_take_id(daemon: Parts, job_id: str, peer_uid: int) -> str | None:
    """Why the caller may not take ``job_id`` (None: it may).  Root and the daemon's user
    speak for the scheduler; anyone else takes only an id of their own or one no other
    account's job holds or held (an ended job's record and folder are still its owner's),
    and a scheduler's id only when that scheduler says the job is theirs: handing over one's
    own process must never end another account's job, take its records or stand in for it."""
    if peer_uid in (0, daemon.uid):
        return None
    existing = daemon.jobs.get(job_id)
    if existing is not None and existing.owner_uid != peer_uid:
        return f"job {job_id} belongs to uid {existing.owner_uid}, not to the caller's uid {peer_uid}"
    previous = daemon.jobs.held_by(job_id) if existing is None else None
    try:
        said = daemon.host.call(
            "scheduler job owner",
            lambda: daemon.host.hook.arbiter_scheduler_job_owner(
                job_id=job_id, context=daemon.host.context(daemon.config)
            ),
        )
    except PluginFailed as exc:
        return f"cannot ask the scheduler whose job {job_id} is: {exc}"
    if said is None:  # no scheduler's id: an id of the caller's own or a free one
        if previous is not None and previous != peer_uid:
            return f"job {job_id} was uid {previous}'s: its folder and record are not the caller's to take"
        return None
    owner, why = said.get("uid"), str(said.get("why") or "")
    if owner is None:
        return f"no scheduler vouches for job {job_id}: {why}"
    if owner != peer_uid:
        return f"job {job_id} is uid {owner}'s, not the caller's uid {peer_uid} ({why})"
    return None  # the scheduler's word: its job ids come round again, to whoever it says


class Reconciler:
    """On the tick: every ``RECONCILE_EVERY_S``, adopt what the schedulers say runs here."""

    def __init__(self, every_s: float = RECONCILE_EVERY_S) -> None:
        self.every_s = every_s
        self._last = -every_s
        self.last_seen: dict[str, int] = {}  # scheduler job id → its process, as last reported (status)

    def due(self, now: float) -> bool:
        return now - self._last >= self.every_s

    def run(self, daemon: Parts) -> Steps[list[str]]:
        """Adopt the scheduler jobs not known yet; the ids adopted.  Steps of the tick's run:
        the look at the schedulers wakes no pool thread of its own."""
        self._last = time.monotonic()
        state = daemon.ticker.node_state() if daemon.snapshot.decision is not None else None
        try:
            answers = yield Step(
                "scheduler jobs",
                lambda: daemon.host.hook.arbiter_scheduler_jobs(
                    node_state=state, context=daemon.host.context(daemon.config)
                ),
            )
        except PluginFailed as exc:
            daemon.recorder.event(codes.PLUGIN_FAILED, "node", f"cannot ask the scheduler what runs here: {exc}")
            return []
        reported = [SchedulerJob(**job) for answer in answers if answer for job in answer]
        if not reported:
            self.last_seen = {}
            return []
        table = yield from daemon.ticker.observer.reading_table()
        by_pid = {p.pid: p for p in table}
        adopted = []
        for job in reported:
            proc = by_pid.get(job.pid)
            if proc is None or proc.uid != job.uid:
                continue  # ended since the scheduler answered, or not the process it named
            try:
                _, new = adopt(daemon, job.id, proc, parse_manifest(job.id, job.manifest), "found by reconciling")
            except AdoptRefused as exc:
                log.warning("not adopting %s: %s", job.id, exc)
                continue
            if new:
                adopted.append(job.id)
        self.last_seen = {job.id: job.pid for job in reported}
        return adopted
