"""Which processes the node holds paused for a Slurm job, shared by every instance of the
translator on the node.

The daemon and its reflex process each have a translator of their own, and either may
resume what the other paused: the daemon's decision a job the reflex process paused on a
phase, the reflex process a job the daemon paused as it adopted it.  So a pause leaves a mark
in the state directory for each process it stopped, naming the job's Slurm id, and a resume
takes the marks away, before it continues the processes.  The instance that resumes learns
the Slurm job from the mark (a process stopped during its TaskProlog has no ``SLURM_JOB_ID``
in its environment yet, and a restarted daemon has forgotten its pauses); an instance that
paused a process keeps it stopped only while its mark is there.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

from arbiter.plugin import ProcessRef


class PauseMarks:
    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir) / "slurm-paused"

    def _path(self, ref: ProcessRef) -> Path:
        return self.dir / f"{ref.pid}-{ref.start_time!r}"

    def put(self, refs: Iterable[ProcessRef], job: str) -> None:
        """Mark ``refs`` paused for Slurm job ``job``."""
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        for ref in refs:
            path = self._path(ref)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, job.encode())
            finally:
                os.close(fd)

    def job(self, ref: ProcessRef) -> str | None:
        """The Slurm job ``ref`` is marked paused for, or None."""
        try:
            with open(self._path(ref), "rb") as fh:
                return fh.read(64).decode(errors="replace") or None
        except OSError:
            return None

    def held(self, ref: ProcessRef) -> bool:
        return self._path(ref).exists()

    def drop(self, refs: Iterable[ProcessRef]) -> None:
        for ref in refs:
            with contextlib.suppress(OSError):
                self._path(ref).unlink()

    def sweep(self) -> None:
        """Take away the marks of processes that are gone (a daemon killed while it held them)."""
        try:
            names = os.listdir(self.dir)
        except OSError:
            return
        for name in names:
            pid = name.split("-", 1)[0]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                with contextlib.suppress(OSError):
                    (self.dir / name).unlink()
