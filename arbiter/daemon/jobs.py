"""The job registry: jobs known to the daemon, shared by the socket threads and the
decision thread behind one lock, persisted through the recorder."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from arbiter.config.jobdocs import Manifest
from arbiter.daemon.safefs import create_file, make_dir, open_dir
from arbiter.engine.types import JobObs
from arbiter.plugin import ProcessRef
from arbiter.state.store import ENDED_JOBS_KEPT, ENDED_JOBS_KEPT_S, JobRecord, Store, stored_cmd

Persist = Callable[[JobRecord], None]

log = logging.getLogger("arbiter.daemon")

EVENTS_FILE = "events.jsonl"
#: how often, at most, a registration looks for ended jobs' folders to remove
SWEEP_EVERY_S = 600.0


def to_monotonic(wall: float | None, now_wall: float, now_mono: float) -> float | None:
    return None if wall is None else now_mono - (now_wall - wall)


class JobRegistry:
    def __init__(self, jobs_dir: Path, persist: Persist, platform: str, ended_kept: int = ENDED_JOBS_KEPT) -> None:
        self.jobs_dir = jobs_dir
        self.persist = persist
        self.platform = platform
        self.ended_kept = ended_kept  # ended jobs' folders kept at most: the newest
        self._recent: dict[int, deque[float]] = {}  # uid → when it registered its jobs of the last minute
        self._since_sweep = 0
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # notified after every decision
        self.verdicts = threading.Condition(self.lock)  # notified after a decision that changed a job's verdict
        self.records: dict[str, JobRecord] = {}
        self._manifests: dict[str, Manifest] = {}  # parsed once: the fast path reads them
        # (job id, field) → that wall-clock time on the monotonic clock, converted once: a
        # wall clock set back an hour must not push a stop's grace period an hour away
        self._mono: dict[tuple[str, str], float] = {}
        self._sweep_at = 0.0  # when registering next looks for ended jobs' folders to remove

    def manifest(self, record: JobRecord) -> Manifest:
        parsed = self._manifests.get(record.id)
        if parsed is None:
            parsed = self._manifests[record.id] = Manifest.model_validate(record.manifest)
        return parsed

    def load(self, store: Store) -> None:
        with self.lock:
            for record in store.jobs():
                self.records[record.id] = record

    def register(
        self, owner_uid: int, manifest: Manifest, cmd: list[str], launcher_pid: int, launcher_start: float
    ) -> JobRecord:
        job_id = f"{manifest.name}-{secrets.token_hex(3)}"
        directory = self.jobs_dir / job_id
        self._make_folder(job_id, owner_uid)
        events = directory / EVENTS_FILE
        record = JobRecord(
            id=job_id,
            owner_uid=owner_uid,
            name=manifest.name,
            manifest=manifest.model_dump(mode="json"),
            cmd=stored_cmd(cmd),
            launcher_pid=launcher_pid,
            launcher_start=launcher_start,
            control_path=str(directory / "control.json"),
            events_path=str(events),
            submitted=time.time(),
        )
        with self.lock:
            self.records[job_id] = record
        self.persist(record)
        return record

    def registered_within(self, uid: int, window_s: float) -> int:
        """How many jobs ``uid`` registered or handed over within the last ``window_s``."""
        with self.lock:
            recent = self._recent.get(uid)
            if recent is None:
                return 0
            cutoff = time.monotonic() - window_s
            while recent and recent[0] < cutoff:
                recent.popleft()
            if not recent:
                del self._recent[uid]
                return 0
            return len(recent)

    def _count(self, uid: int) -> None:
        with self.lock:
            recent = self._recent.setdefault(uid, deque(maxlen=100_000))
            recent.append(time.monotonic())

    def _make_folder(self, job_id: str, owner_uid: int, again: bool = False) -> None:
        """``jobs/ID/`` with its events file, made through open folders: a folder swapped
        for a link between two calls turns neither into a ``chown`` of another file.  With
        ``again`` (a job id an outside scheduler uses once more, as for a requeued job) the
        folder may be there already, and its events file is made anew."""
        state_fd = open_dir(self.jobs_dir.parent)
        try:
            jobs_fd = make_dir(state_fd, self.jobs_dir.name, 0o755, exist_ok=True)  # jobs read their control document
        finally:
            os.close(state_fd)
        self._count(owner_uid)
        try:
            self._since_sweep += 1
            # by time, and often enough that no more than a tenth again of the folders kept pile up
            if time.monotonic() >= self._sweep_at or self._since_sweep >= max(1, self.ended_kept // 10):
                self._sweep_at = time.monotonic() + SWEEP_EVERY_S
                self._since_sweep = 0
                self._sweep(jobs_fd)
            job_fd = make_dir(jobs_fd, job_id, 0o755, exist_ok=again)
            try:
                if again:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(EVENTS_FILE, dir_fd=job_fd)
                # the job writes its events as its owner; the daemon alone writes the control document
                create_file(job_fd, EVENTS_FILE, 0o644, owner=owner_uid if os.geteuid() == 0 else None)
            finally:
                os.close(job_fd)
        finally:
            os.close(jobs_fd)

    def _sweep(self, jobs_fd: int) -> None:
        """Remove the folders of jobs that ended more than ENDED_JOBS_KEPT_S ago (unchanged
        since), and of all but the newest ``ended_kept`` ended jobs, never following a link:
        what is in them is the jobs' to write."""
        cutoff = time.time() - ENDED_JOBS_KEPT_S
        with self.lock:
            active = set(self.records)
        ended: list[tuple[float, str]] = []
        for name in os.listdir(jobs_fd):
            if name in active:
                continue
            try:
                st = os.stat(name, dir_fd=jobs_fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                ended.append((st.st_mtime, name))
        ended.sort(reverse=True)
        for rank, (mtime, name) in enumerate(ended):
            if rank < self.ended_kept and mtime > cutoff:
                continue
            try:
                fd = open_dir(name, jobs_fd)
                try:
                    for entry in os.listdir(fd):
                        os.unlink(entry, dir_fd=fd)
                finally:
                    os.close(fd)
                os.rmdir(name, dir_fd=jobs_fd)
            except OSError as exc:  # a folder a job made inside its own: left, and said once
                log.info("left the folder of ended job %s in place: %s", name, exc)

    def adopt(self, job_id: str, owner_uid: int, manifest: Manifest, pid: int, start: float) -> JobRecord:
        """A job that is running already (an outside scheduler started it): its process is
        both its launcher and its root, so it ends when that process and its tree are gone."""
        directory = self.jobs_dir / job_id
        self._make_folder(job_id, owner_uid, again=True)
        events = directory / EVENTS_FILE
        now = time.time()
        record = JobRecord(
            id=job_id,
            owner_uid=owner_uid,
            name=manifest.name,
            manifest=manifest.model_dump(mode="json"),
            cmd=[job_id],
            launcher_pid=pid,
            launcher_start=start,
            control_path=str(directory / "control.json"),
            events_path=str(events),
            submitted=now,
            state="running",
            root_pid=pid,
            root_start=start,
        )
        with self.lock:
            self.records[job_id] = record
            self._manifests.pop(job_id, None)
        self.persist(record)
        return record

    def held_by(self, job_id: str) -> int | None:
        """The account whose events file an ended job of this id left in its folder (None:
        no folder is left): a folder is its job's owner's until it is pruned."""
        try:
            return os.stat(self.jobs_dir / job_id / EVENTS_FILE, follow_symlinks=False).st_uid
        except (OSError, ValueError):
            return None

    def get(self, job_id: str) -> JobRecord | None:
        with self.lock:
            return self.records.get(job_id)

    def find(self, key: str) -> list[JobRecord]:
        """Jobs by id, or by name (several runs may share one)."""
        with self.lock:
            if key in self.records:
                return [self.records[key]]
            return [r for r in self.records.values() if r.name == key]

    def active(self) -> list[JobRecord]:
        with self.lock:
            return [r for r in self.records.values() if r.state != "ended"]

    def update(self, job_id: str, **fields: Any) -> JobRecord | None:
        with self.lock:
            record = self.records.get(job_id)
            if record is None:
                return None
            for key, value in fields.items():
                setattr(record, key, value)
                self._mono.pop((job_id, key), None)  # converted anew when next observed
            if record.state == "ended":
                self.records.pop(job_id)
                self._manifests.pop(job_id, None)
                self._mono.pop((job_id, "submitted"), None)
                self._mono.pop((job_id, "stop_requested"), None)
        self.persist(record)
        return record

    def _monotonic(self, job_id: str, key: str, wall: float | None, now_wall: float, now_mono: float) -> float | None:
        if wall is None:
            return None
        mono = self._mono.get((job_id, key))
        if mono is None:
            mono = self._mono[(job_id, key)] = to_monotonic(wall, now_wall, now_mono)  # type: ignore[assignment]
        return mono

    def observations(
        self,
        processes: Mapping[str, tuple[ProcessRef, ...]],
        now_mono: float,
        busy: Mapping[str, float | None] | None = None,
        busy_at: float | None = None,
        vram: Mapping[str, int | None] | None = None,
    ) -> dict[str, JobObs]:
        """Every job as the engine sees it, with its measured GPU duty (``busy``) sampled at
        ``busy_at`` where there is a sample, and the VRAM its processes hold (``vram``)."""
        now_wall = time.time()
        out = {}
        with self.lock:
            records = list(self.records.values())
        for r in records:
            manifest = self.manifest(r)
            gpu = manifest.gpu_for(self.platform)
            pids = tuple(ref.pid for ref in processes.get(r.id, ()))
            if not pids and r.root_pid is not None:
                pids = (r.root_pid,)  # started since the last scan
            out[r.id] = JobObs(
                job_id=r.id,
                name=r.name,
                owner_uid=r.owner_uid,
                use=gpu.use,
                capabilities=frozenset(manifest.capabilities),
                max_duty=gpu.max_duty,
                started=r.root_pid is not None,
                pids=pids,
                run=r.root_start,
                submitted_at=self._monotonic(r.id, "submitted", r.submitted, now_wall, now_mono) or 0.0,
                user_hold=r.user_hold,
                stop_requested_at=self._monotonic(r.id, "stop_requested", r.stop_requested, now_wall, now_mono),
                measured=(busy or {}).get(r.id),
                measured_at=busy_at if busy is not None and r.id in busy else None,
                vram_bytes=(vram or {}).get(r.id),
            )
        return out
