"""The values plugins and the daemon hand each other: what is observed (processes, GPU
readings, source states) and what is acted on (jobs, their processes, action results).
Plugins reach them through :mod:`arbiter.plugin`, which re-exports every one."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from arbiter.engine.types import Phase

# --- observations -------------------------------------------------------------------------


#: ``ProcessInfo.state`` of a process that has exited and that its parent has not waited for yet
EXITED = "Z"


@dataclass(frozen=True)
class ProcessInfo:
    """One process as a process table provider sees it."""

    pid: int
    ppid: int
    name: str = ""
    exe: str = ""
    cmdline: tuple[str, ...] = ()
    uid: int = -1
    username: str = ""
    start_time: float = 0.0  # identity check: a pid reused later has another start time
    state: str = ""  # one-letter process state where the platform has one (EXITED: see there)
    #: user + system CPU time so far, where the table reads it at no extra cost (None where
    #: it does not); left out of comparisons, so a process that only ran is equal to itself
    cpu_ns: int | None = field(default=None, compare=False)

    @property
    def ref(self) -> ProcessRef:
        return ProcessRef(self.pid, self.start_time)


@dataclass(frozen=True)
class ProcessGpu:
    """One process's cumulative GPU busy time (per engine) and VRAM."""

    busy_ns: Mapping[str, int] = field(default_factory=dict)
    vram_bytes: int | None = None


@dataclass(frozen=True)
class GpuReading:
    """What a reader saw at one moment.

    ``at_ns`` is a monotonic timestamp of the reading; busy times are cumulative, so the
    share of a process over an interval is the difference of two readings.
    """

    readable: bool
    at_ns: int = 0
    processes: Mapping[int, ProcessGpu] = field(default_factory=dict)
    device: str = "gpu"  # "cpu" for stand-in readers
    vram_total_bytes: int | None = None
    vram_free_bytes: int | None = None
    why: str = ""  # why it is not readable, or a note on what was read
    #: pids asked for whose GPU time could not be read (denied): they count as using the GPU,
    #: where a pid simply absent from ``processes`` uses none
    unreadable: frozenset[int] = frozenset()
    #: the GPUs read, by name (certificates are bound to them)
    devices: tuple[str, ...] = ()
    #: the GPU driver and its version as the reader's library reports it ("" where it reports
    #: none): certificates are bound to it too, since a new driver can change what sharing costs
    driver: str = ""


@dataclass(frozen=True)
class SourceState:
    """A source's current reading.

    ``count`` is cumulative (matching events since the source opened); a source that measures
    a rate itself reports it in ``rate`` (events per second) instead.  ``phase`` is ``None``
    for a source that reports no phase.  ``changed_at`` is the monotonic time the source saw
    the write that caused the last change, so the daemon can report reaction latency.

    A busy probe (a rule's ``busy:`` source) says whether its tenant is working in ``busy``:
    ``None`` for a source that reports no busy state, and always ``None`` while it is not
    readable (unknown, which counts as busy).  ``models`` are the names of the models the
    tenant has loaded, where the probe reads them (for a release per model); while it is not
    readable, the names it read last.  ``read_at`` is the monotonic time the reading it reports
    was begun (0 where the source does not say): a probe that polls sets it, so that the
    daemon, before a release a busy tenant cannot take, can wait for a reading begun after it
    asked for one (``refresh``), not take one that was under way while the tenant got work.
    """

    readable: bool = True
    count: int = 0
    rate: float | None = None
    phase: Phase | None = None
    why: str = ""
    changed_at: float = 0.0
    needs_helper: bool = False
    busy: bool | None = None
    models: tuple[str, ...] = ()
    read_at: float = 0.0


# --- actions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessRef:
    """A process identity: a signal goes to ``pid`` only while its start time is this one."""

    pid: int
    start_time: float


@dataclass(frozen=True)
class Checkpoint:
    """How a job stopped for protection (evicted) saves its work first, as the protecting
    rule's ``eviction:`` says: the signal it is given (a batch scheduler's ``--signal``
    syntax, ``B:USR1``) and the longest it may take; None leaves either to the translator's
    own settings."""

    signal: str | None = None
    seconds: float | None = None


@dataclass(frozen=True)
class JobTarget:
    """The job a translator acts on: its processes (root first) and its control document;
    for the terminate of an eviction, the evicting rule's checkpoint settings."""

    job_id: str
    name: str
    processes: tuple[ProcessRef, ...]
    control_path: str | None = None
    cooperative: bool = False
    checkpoint: Checkpoint | None = None


@dataclass(frozen=True)
class ActionResult:
    """What a translator did for a request it sends to a program (a release, a reacquire).

    ``requested`` names each request it sent (e.g. ``"model mistral:latest"``); ``errors``
    says, for a user, each one that failed; ``note`` says why nothing was sent, where nothing
    was.  A translator returns failures here rather than raising them.
    """

    requested: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    note: str = ""

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass(frozen=True)
class ControlUpdate:
    """A new control document for a job (the wire protocol of ``arbiter schema control``)."""

    state: Literal["run", "paused", "stop"]
    gpu_duty: float
    reason: str = ""
