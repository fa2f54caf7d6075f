"""The job registry: jobs known to the daemon, shared by the socket threads and the
decision thread behind one lock, persisted through the recorder."""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from arbiter.config.models import Manifest
from arbiter.engine.types import JobObs
from arbiter.plugin import ProcessRef
from arbiter.store import JobRecord, Store

Persist = Callable[[JobRecord], None]


def to_monotonic(wall: float | None, now_wall: float, now_mono: float) -> float | None:
    return None if wall is None else now_mono - (now_wall - wall)


class JobRegistry:
    def __init__(self, jobs_dir: Path, persist: Persist, platform: str) -> None:
        self.jobs_dir = jobs_dir
        self.persist = persist
        self.platform = platform
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # notified after every decision
        self.records: dict[str, JobRecord] = {}
        self._manifests: dict[str, Manifest] = {}  # parsed once: the fast path reads them
        # (job id, field) → that wall-clock time on the monotonic clock, converted once: a
        # wall clock set back an hour must not push a stop's grace period an hour away
        self._mono: dict[tuple[str, str], float] = {}

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
        directory.mkdir(parents=True, mode=0o755)
        events = directory / "events.jsonl"
        events.touch(mode=0o644)
        if os.geteuid() == 0 and owner_uid != 0:
            os.chown(events, owner_uid, -1)  # the job writes its events as its owner
        record = JobRecord(
            id=job_id,
            owner_uid=owner_uid,
            name=manifest.name,
            manifest=manifest.model_dump(mode="json"),
            cmd=cmd,
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
                submitted_at=self._monotonic(r.id, "submitted", r.submitted, now_wall, now_mono) or 0.0,
                user_hold=r.user_hold,
                stop_requested_at=self._monotonic(r.id, "stop_requested", r.stop_requested, now_wall, now_mono),
                measured=(busy or {}).get(r.id),
                measured_at=busy_at if busy is not None and r.id in busy else None,
                vram_bytes=(vram or {}).get(r.id),
            )
        return out
