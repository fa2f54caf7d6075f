"""What each job says of itself in its events file (``ARBITER_EVENTS``), read on the tick.

A job appends JSON lines (``arbiter.sdk`` writes them): its phase, its progress, the GPU
duty it holds, and that it acknowledged a stop.  The daemon keeps the latest of each for
status and ``explain``; it never decides on them (what a job says of its duty is checked
against what the reader measures, not believed).

The file is the job's to write, so it is read as untrusted input: each line is validated
against the wire protocol's model, a line that fails is counted and named (file, line,
what was wrong, never its content: status is readable by other users), and a job that
writes faster than the daemon reads is read a bounded share per tick.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError

from arbiter.config.jobdocs import JobEvent, MetricEvent, PhaseEvent, ProgressEvent, StopAckEvent

#: bytes read of one job's file per tick at most; the rest waits for the next tick
READ_PER_JOB = 256 * 1024

#: bytes read of all jobs' files per tick at most (the tick also scans and decides)
READ_PER_TICK = 1024 * 1024

#: a longer line is malformed (and skipped to its end) rather than held in memory
MAX_LINE_BYTES = 64 * 1024


@dataclass(frozen=True)
class JobReport:
    """The latest of what one job reported; times are the events' own ``t`` (wall clock)."""

    phase: str | None = None
    phase_at: float | None = None
    done: int | None = None
    total: int | None = None
    progress_at: float | None = None
    duty: float | None = None  # the gpu_duty metric: the duty the job says it held
    busy: float | None = None  # and the busy share it measured of itself
    device: str | None = None
    duty_at: float | None = None
    stop_acked_at: float | None = None
    lines: int = 0  # valid lines read
    malformed: int = 0
    problem: str = ""  # the last malformed line: where, and what was wrong
    why: str = ""  # why the file cannot be read ("" when it can)
    behind_bytes: int = 0  # written but not read yet (a job writing faster than the reading)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"lines": self.lines, "malformed": self.malformed}
        if self.phase is not None:
            out["phase"] = {"name": self.phase, "at": self.phase_at}
        if self.done is not None:
            out["progress"] = {"done": self.done, "total": self.total, "at": self.progress_at}
        if self.duty is not None:
            out["duty"] = {"duty": self.duty, "busy": self.busy, "device": self.device, "at": self.duty_at}
        if self.stop_acked_at is not None:
            out["stop_acked_at"] = self.stop_acked_at
        for key in ("problem", "why", "behind_bytes"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        return out


def _applied(report: JobReport, event: Any) -> JobReport:
    if isinstance(event, PhaseEvent):
        return replace(report, phase=event.phase, phase_at=event.t)
    if isinstance(event, ProgressEvent):
        return replace(report, done=event.done, total=event.total, progress_at=event.t)
    if isinstance(event, MetricEvent):
        if event.name != "gpu_duty":
            return report  # a metric of the job's own: kept by the job, not here
        return replace(report, duty=event.duty, busy=event.busy, device=event.device, duty_at=event.t)
    if isinstance(event, StopAckEvent):
        return replace(report, stop_acked_at=event.t)
    return report


def _what_was_wrong(exc: ValidationError) -> str:
    first = exc.errors(include_input=False, include_url=False)[0]
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "root")
    return f"{where}: {first['msg']}" if where else str(first["msg"])


class _Follow:
    """One job's file: where the reading is, and what it found so far."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.pos = 0
        self.line_no = 0  # lines taken so far, so a problem names its line
        self.partial = b""
        self.discarding = False  # inside a line past MAX_LINE_BYTES
        self.report = JobReport()

    def read(self, budget: int) -> int:
        """Take what was appended, up to ``budget`` bytes; returns the bytes read.

        The file is opened only while there is something to read, and closed at once: a
        descriptor held per registered job would let one account that registers jobs in
        bulk use up the daemon's descriptors (and with them its means to pause anything).
        """
        try:
            size = os.stat(self.path, follow_symlinks=False).st_size
        except FileNotFoundError:
            self.report = replace(self.report, why=f"{self.path} does not exist")
            return 0
        except OSError as exc:
            self.report = replace(self.report, why=f"cannot read {self.path}: {exc.strerror or exc}")
            return 0
        if size == self.pos or budget <= 0:
            behind = max(0, size - self.pos)
            if self.report.why or self.report.behind_bytes != behind:  # most ticks: nothing new, kept as it is
                self.report = replace(self.report, why="", behind_bytes=behind)
            return 0
        try:
            # opened, then checked: what the name pointed to at the stat may be gone by now
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            self.report = replace(self.report, why=f"cannot open {self.path}: {exc.strerror or exc}")
            return 0
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                self.report = replace(self.report, why=f"{self.path} is not a regular file")
                return 0
            size = st.st_size
            if size < self.pos:  # truncated: the job started its file over
                self.pos, self.line_no, self.partial, self.discarding = 0, 0, b"", False
            data = os.pread(fd, min(budget, size - self.pos), self.pos)
        except OSError as exc:
            self.report = replace(self.report, why=f"cannot read {self.path}: {exc.strerror or exc}")
            return 0
        finally:
            os.close(fd)
        self.pos += len(data)
        self._take(data)
        self.report = replace(self.report, why="", behind_bytes=max(0, size - self.pos))
        return len(data)

    def _take(self, data: bytes) -> None:
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        report = self.report
        for line in lines:
            if self.discarding:  # the end of a line already counted as too long
                self.discarding = False
                continue
            self.line_no += 1
            report = self._line(report, line)
        if self.discarding:
            self.partial = b""  # still inside that line
        elif len(self.partial) > MAX_LINE_BYTES:
            self.line_no += 1
            self.partial, self.discarding = b"", True
            report = self._bad(report, f"longer than {MAX_LINE_BYTES} bytes")
        self.report = report

    def _line(self, report: JobReport, line: bytes) -> JobReport:
        line = line.strip(b" \t\r")  # JSON's own white space, no other
        if not line:
            return report
        if len(line) > MAX_LINE_BYTES:
            return self._bad(report, f"longer than {MAX_LINE_BYTES} bytes")
        try:
            event = JobEvent.model_validate_json(line).root
        except ValidationError as exc:
            return self._bad(report, _what_was_wrong(exc))
        return replace(_applied(report, event), lines=report.lines + 1)

    def _bad(self, report: JobReport, why: str) -> JobReport:
        return replace(
            report,
            malformed=report.malformed + 1,
            problem=f"{self.path} line {self.line_no}: {why} (see `arbiter schema event`)",
        )


class JobEventLog:
    """Every active job's events file, followed from tick to tick."""

    def __init__(self) -> None:
        self._follows: dict[str, _Follow] = {}
        self._turn = 0  # whose file is read first: a flood in one cannot starve the others

    def close(self) -> None:
        self._follows.clear()

    def read(self, paths: Mapping[str, str]) -> dict[str, JobReport]:
        """Read what each job (id → its events path) appended since the last call; jobs not
        named are forgotten.  Returns each named job's report."""
        for job_id in [j for j in self._follows if j not in paths]:
            del self._follows[job_id]
        for job_id, path in paths.items():
            follow = self._follows.get(job_id)
            if follow is None or follow.path != path:
                self._follows[job_id] = _Follow(path)
        order = sorted(self._follows)
        if order:
            self._turn = (self._turn + 1) % len(order)
            order = order[self._turn :] + order[: self._turn]
        left = READ_PER_TICK
        for job_id in order:
            left -= self._follows[job_id].read(min(READ_PER_JOB, left))
        return {job_id: follow.report for job_id, follow in self._follows.items()}
