"""The public plugin API: the one arbiter module a plugin imports.

A plugin is a module (or object) with functions marked ``@hookimpl`` (see
:mod:`arbiter.hookspecs` for every hook).  Each family hook receives a
``register(name, cls)`` callback; ``name`` is the ``kind:`` rule files use and
``cls`` subclasses one of the base classes below, with a pydantic ``Options``
model (``extra="forbid"``) that validates the kind's block of a rule file.

It runs past 400 lines because it is the whole public API a plugin imports: ``arbiter.plugin``
and nothing else, so every base class is here, and it re-exports the values plugins and the
daemon hand each other (:mod:`arbiter.plugindata`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pluggy
from pydantic import BaseModel, ConfigDict

from arbiter.engine.types import Phase as Phase
from arbiter.plugindata import (
    EXITED,
    ActionResult,
    Checkpoint,
    ControlUpdate,
    GpuReading,
    JobTarget,
    ProcessGpu,
    ProcessInfo,
    ProcessRef,
    SourceState,
)
from arbiter.runtime.children import run_child, start_child
from arbiter.runtime.childwork import ChildWorker, ChildWorkFailed
from arbiter.runtime.httpread import AnswerRefused, HttpAnswer, http_read, quote
from arbiter.runtime.secretref import SecretRef, secret_values
from arbiter.sdk.control import NUDGE_SIGNAL, write_control_document

try:
    import resource
except ImportError:  # pragma: no cover - not a POSIX host
    resource = None  # type: ignore[assignment]

PROJECT = "arbiter"
hookimpl = pluggy.HookimplMarker(PROJECT)

__all__ = [
    "EXITED",
    "NUDGE_SIGNAL",
    "PROJECT",
    "ActionResult",
    "AnswerRefused",
    "Checkpoint",
    "ChildWorkFailed",
    "ChildWorker",
    "ControlUpdate",
    "GpuReading",
    "HostSignal",
    "HttpAnswer",
    "JobTarget",
    "KindOptions",
    "Matcher",
    "PluginContext",
    "PluginError",
    "Probe",
    "ProcessGpu",
    "ProcessInfo",
    "ProcessRef",
    "Reader",
    "Register",
    "SecretRef",
    "Source",
    "SourceState",
    "Translator",
    "hookimpl",
    "http_read",
    "open_file_share",
    "quote",
    "run_child",
    "secret_values",
    "send_refused",
    "start_child",
    "write_control_document",
]


#: the callback every family hook receives: ``register(kind_name, cls)``
Register = Callable[[str, type], None]


class PluginError(Exception):
    """Raised by a plugin for a failure it can describe (``str(exc)`` is shown to users)."""


class KindOptions(BaseModel):
    """Base for a kind's options: unknown fields are errors, values are immutable.

    A rule file is trusted with what the daemon does for it only as far as the accounts that
    may change it are: options that have the daemon do more than any local account could do
    by itself (run a command, send requests that act on a program or carry credentials, apply
    a GPU profile) say so in :meth:`needs_trusted_file`, and a rule file holding them then
    loads only from a file and folders that only root or the daemon's user can change.  A
    kind that runs a command sets ``runs_command = True``, which says so too.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    runs_command: ClassVar[bool] = False

    def gives_phase(self) -> bool | None:
        """For a source's options: whether the source they make reports a phase (on, off,
        soon), as a rule's ``during:`` needs.  ``arbiter check`` refuses a ``during:`` source
        whose options say ``False``; ``None`` (the default) says nothing either way."""
        return None

    def needs_trusted_file(self) -> str | None:
        """Why these options may come only from a rule file that only root or the daemon's
        user can change ("it runs a command"), or None when any rule file may hold them."""
        return "runs a command" if self.runs_command else None


@dataclass(frozen=True)
class PluginContext:
    """What the daemon tells every plugin instance it creates."""

    state_dir: Path
    stand_in_gpu: bool = False
    daemon_uid: int = 0
    rule_id: str | None = None
    #: a translator calls this with (job id or "", ref, why) for each recorded process it
    #: left alone because the pid now names another process (a reused pid); the daemon puts
    #: it on the timeline.  It only queues, so it may be called on the fast path.
    pid_reused: Callable[[str, ProcessRef, str], None] | None = None
    #: a translator calls this with (job id or "", code, message, data) for what an action did
    #: that the timeline shows (a pause that freed a job's VRAM, or could not); it only queues
    note: Callable[[str, str, str, dict[str, Any]], None] | None = None
    #: the node config's plugin sections (see ``arbiter_register_node_sections``), validated,
    #: by section name; a section a plugin registered and the node config leaves out holds its
    #: model's defaults (absent where the model has a field without one)
    sections: Mapping[str, KindOptions] = field(default_factory=dict)
    #: a plugin calls this with (url, headers) right before it sends request headers or an
    #: action to ``url`` for its rule: None when it may, else why not (the daemon has put the
    #: refusal on the timeline).  The daemon sends credentials and actions only to a program
    #: its rule matched; None here (outside a daemon): no check.
    may_send: Callable[[str, Mapping[str, str | SecretRef]], str | None] | None = None


def send_refused(context: PluginContext, url: str, headers: Mapping[str, str | SecretRef]) -> str | None:
    """Why ``url`` must not get these headers or an action now (None: it may): see
    :attr:`PluginContext.may_send`."""
    return None if context.may_send is None else context.may_send(url, headers)


def open_file_share(divisor: int, unlimited: int) -> int:
    """How many files a plugin may keep open between calls (descriptors it re-reads rather
    than reopens): a ``divisor``-th of the process's open-file limit, as the daemon's
    sockets, watches and children need the rest; ``unlimited`` where there is no limit, and
    0 where the limit cannot be asked."""
    if resource is None:
        return 0
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (OSError, ValueError):
        return 0
    return unlimited if soft == resource.RLIM_INFINITY else max(0, soft // divisor)


# --- families ------------------------------------------------------------------------------


class _Kind:
    Options: ClassVar[type[KindOptions]] = KindOptions

    def close(self) -> None:
        """Release what the instance holds (threads, files, handles)."""


class Matcher(_Kind):
    """Selects the processes a rule's ``match:`` block names."""

    #: True when ``select`` judges each process on its own, by its ProcessInfo alone, so that
    #: what it selects from a list is what it would select from any part of that list.  The
    #: daemon then offers it processes an earlier rule claimed too, and drops those from its
    #: choice, and on most ticks offers it only the processes new or changed since the last
    #: (every process on every 20th tick); leave it False where a choice
    #: depends on other processes (a walk down the process tree).
    judges_each_process: bool = False

    def __init__(self, options: KindOptions) -> None:
        self.options = options

    def select(self, processes: Sequence[ProcessInfo]) -> set[int]:
        raise NotImplementedError

    def examples(self) -> Sequence[ProcessInfo]:
        """Processes it is written to select, made from its own options (their pids are set
        by the caller): ``arbiter check`` offers every rule's examples to every matcher to
        name the rules that select the same processes.  None by default."""
        return ()

    def misses(self, process: ProcessInfo) -> list[str]:
        """For a process :meth:`select` leaves out, each field of the ``match:`` block that it
        fails, as ``"field: why"`` (``arbiter rules`` shows them beside a near miss); [] where
        the matcher cannot tell."""
        return []


class Reader(_Kind):
    """Reads each process's GPU busy time and VRAM, and the device's VRAM."""

    #: a stand-in reader (not a GPU) counts only where the node config allows it
    stand_in: ClassVar[bool] = False
    #: the ``sys.platform`` values it reads on (empty: any); without ``readers:`` in the node
    #: config, a reader for another platform is not tried (nor listed by ``arbiter doctor``)
    platforms: ClassVar[frozenset[str]] = frozenset()
    #: without ``readers:`` in the node config, readers are tried lowest first (then by
    #: name): a vendor's own per-process accounting before a generic one
    preference: ClassVar[int] = 50

    def __init__(self, options: KindOptions, context: PluginContext) -> None:
        self.options = options
        self.context = context

    @classmethod
    def reads_here(cls) -> bool:
        """Whether this platform is one it reads on."""
        return not cls.platforms or sys.platform in cls.platforms

    def read(self, pids: Collection[int]) -> GpuReading:
        raise NotImplementedError

    def read_table(self, processes: Mapping[int, ProcessInfo], at_ns: int) -> GpuReading | None:
        """The reading taken from what the process table read, or None to be asked
        :meth:`read`: a reader whose figures the table holds (CPU time) need not read them
        again.  Called on the tick before :meth:`read`.

        :param processes: each pid to read, with this tick's :class:`ProcessInfo` of it.
        :param at_ns: the monotonic time the table was read (the reading's ``at_ns``).
        """
        return None


class Source(_Kind):
    """A protected program's progress (a count) and/or phase, watched for changes.

    ``start(on_change)`` begins watching; the source calls ``on_change(state)`` from its own
    thread the moment it sees a change.  The daemon acts on a phase change on that thread
    where it can (the jobs it pauses are signalled before ``on_change`` returns, a
    millisecond or two) and queues it otherwise: ``on_change`` never waits for the daemon's
    locks, and the source must not hold a lock that ``state()`` needs while it calls it.
    ``state()`` returns the current reading without blocking.

    A source that watches processes names the option holding a match block in
    ``match_option``; the daemon builds that matcher and, on every tick, calls
    ``processes(pids)`` with the processes it selects.
    """

    match_option: ClassVar[str | None] = None
    #: it judges from the VRAM its tenant holds: the daemon calls ``tenant_vram()`` on every
    #: tick, before it reads ``state()``
    uses_vram: ClassVar[bool] = False

    def __init__(self, options: KindOptions, context: PluginContext) -> None:
        self.options = options
        self.context = context

    def start(self, on_change: Callable[[SourceState], None]) -> None:
        raise NotImplementedError

    def state(self) -> SourceState:
        raise NotImplementedError

    def processes(self, pids: frozenset[int]) -> None:
        """The processes ``match_option`` selects now (called on the tick)."""

    def tenant_vram(self, held_bytes: int | None) -> None:
        """The VRAM its tenant's processes hold now, summed over them (called on the tick for a
        source with ``uses_vram``).

        :param held_bytes: bytes, as the readers read them; ``None`` when they cannot read the
            tenant's VRAM.
        """

    def refresh(self) -> None:
        """Read again now rather than at the next poll: the daemon calls it when the tenant's
        ``events:`` source wakes it, and before a release that a busy tenant cannot take.  Must
        not block: a polling source wakes its own thread.  A read under way when it is called
        does not stand for the one asked: such a source reads once more after it, and says in
        each state's ``read_at`` when the read it reports began."""

    def tenant_running(self, running: bool) -> None:
        """Whether its rule's program runs now: called on the tick for a rule's ``busy:`` probe
        and its ``events:`` source, on the first tick and whenever that changes.  What a busy
        probe reads counts only while its program runs, so a polling probe need not poll while
        it does not, nor an events source try to connect to it (a quiet node then wakes for
        nothing); once it runs again the source reads or connects at once.  Must not block."""

    def watched_elsewhere(self, elsewhere: bool) -> None:
        """Whether another process watches what this source watches and tells the daemon each
        change (the reflex process, for an immediate rule's phase): called with True once that
        process's readings stand for this source's, False once they no longer do (it is gone,
        or cannot watch it).  Meanwhile a source that wakes on each change need not: it may
        read only on its own safety interval and when ``state()`` is asked (the tick asks, and
        takes that reading where the other process has gone quiet: it may have stalled), so
        that a change wakes one reader, not two, at the moment its pauses are made.  On False
        it reads at once and wakes on each change again.  Must not block."""


class Translator(_Kind):
    """Applies decisions to programs.  ``actions`` names what it can do:

    ``pause``/``resume`` (a process tree), ``control`` (a job's control document and nudge),
    ``terminate``/``kill`` (end a process tree), ``release`` (ask a tenant to give its VRAM
    back), ``reacquire`` (ask it to take that VRAM back), ``profile`` (apply a GPU
    profile, such as clocks and a power limit, and restore what it changed).  Every method is
    idempotent.
    """

    actions: ClassVar[frozenset[str]] = frozenset()
    #: True when ``pause`` and ``resume`` bound their own time: they make only system calls
    #: that return at once (signals, reads of the kernel's process files), or wait with a
    #: deadline of their own.  The daemon then calls them on the thread that decided, with
    #: their exceptions isolated but without a timeout, instead of handing each call to a
    #: plugin thread: under load that hand-off waited for the interpreter lock and for a
    #: CPU, and was the largest part of the time a phase took to pause its jobs.  Leave it
    #: False for anything that can wait on a network, another process or a lock.
    bounded: ClassVar[bool] = False
    #: True when its pause gives the job's VRAM back (a checkpoint of its device memory), so
    #: that VRAM counts as releasable while the job may be paused
    frees_vram: ClassVar[bool] = False
    #: where it stands, for each action it declares, when the node config's ``translators:``
    #: names none for that action: the daemon tries the installed translators by rank, lowest
    #: first (then by name), and uses the first that is available here.  A translator that
    #: does not bound its own time ranks high, so that it serves only where it is named: the
    #: reflex process, the fast path, needs a bounded pause
    rank: ClassVar[int] = 100

    def __init__(self, options: KindOptions, context: PluginContext) -> None:
        self.options = options
        self.context = context

    def available(self) -> tuple[bool, str]:
        """Whether it can act on this host, and why not."""
        return True, ""

    def pause_effect(self, refs: Sequence[ProcessRef]) -> str:
        """What its pause of these processes stops and frees, and what it leaves held (its
        VRAM), in a sentence ``arbiter explain`` shows beside a paused job.  Must not block.

        :param refs: the processes of one job that it paused.
        """
        return ""

    def pause(self, target: JobTarget) -> list[ProcessRef]:
        """Pause every process of ``target``; return those it paused."""
        raise NotImplementedError

    def resume(self, refs: Sequence[ProcessRef]) -> None:
        raise NotImplementedError

    def settle(self, refs: Sequence[ProcessRef], timeout_s: float) -> bool:
        """Wait, at most ``timeout_s``, until the processes ``pause`` was just given have
        stopped (for a process of many threads, the kernel's state of its main thread).

        The daemon asks this of a bounded translator for the job it pauses first, before it
        signals the others: their wake-ups would compete for a core with the process that
        must run to stop.  The default waits for nothing, for a pause that has taken hold
        when ``pause`` returns.

        :returns: True once they have stopped (or exited); False at the deadline, or where
            it cannot tell.
        """
        return True

    def control(self, target: JobTarget, update: ControlUpdate, seq: int) -> None:
        raise NotImplementedError

    def terminate(self, target: JobTarget) -> None:
        raise NotImplementedError

    def kill(self, target: JobTarget) -> None:
        raise NotImplementedError

    def release(self, tenant: str, models: Sequence[str] = ()) -> ActionResult:
        """Ask a tenant to release the VRAM it holds.  Releasing is asynchronous in most
        programs: the daemon confirms it by watching the tenant's VRAM fall.

        :param tenant: the tenant's rule id (for messages).
        :param models: the names of the models it has loaded, as its busy probe read them
            (a translator that releases per model sends one request per name, none for none).
        :returns: what was sent and every error, which are returned, never raised.
        """
        raise PluginError(
            f"this translator cannot release VRAM (asked for tenant {tenant!r}); "
            "use a kind whose actions include release, such as http_post"
        )

    def reacquire(self, tenant: str, models: Sequence[str] = ()) -> ActionResult:
        """Ask a tenant to take back the VRAM a release freed (wake a server put to sleep).
        The daemon asks once no other tenant needs that VRAM, and confirms it by watching the
        tenant's VRAM rise.

        :param tenant: the tenant's rule id (for messages).
        :param models: the names of the models its busy probe last read loaded.
        :returns: what was sent and every error, which are returned, never raised.
        """
        raise PluginError(
            f"this translator cannot bring a tenant back (asked for tenant {tenant!r}); "
            "use a kind whose actions include reacquire, such as http_post"
        )

    def read_profile(self, tenant: str) -> dict[str, Any]:
        """Read the device settings the profile will change, before it is applied.

        The daemon persists the answer before it calls :meth:`apply_profile` and hands it to
        :meth:`restore_profile` when the tenant stops working on the GPU, or on start-up after
        a crash; it reads again only once the saved settings were restored.

        :param tenant: the tenant's rule id (for messages).
        :returns: what :meth:`restore_profile` needs to put the device back, JSON-serialisable
            (it is stored as JSON and may be restored by another process of the daemon).
        :raises PluginError: when the device cannot be read at all; then nothing is applied.
        """
        raise PluginError(
            f"this translator applies no GPU profile (asked for tenant {tenant!r}); "
            "use a kind whose actions include profile, such as gpu_profile"
        )

    def apply_profile(self, tenant: str) -> ActionResult:
        """Apply the profile its options describe, while the tenant works on the GPU.

        :param tenant: the tenant's rule id (for messages).
        :returns: each setting it changed (and, in ``note``, any value it had to adjust to what
            the device allows) and every error, which are returned, never raised.
        """
        raise PluginError(
            f"this translator applies no GPU profile (asked for tenant {tenant!r}); "
            "use a kind whose actions include profile, such as gpu_profile"
        )

    def restore_profile(self, tenant: str, saved: dict[str, Any]) -> ActionResult:
        """Put back what :meth:`apply_profile` changed.

        :param tenant: the tenant's rule id (for messages).
        :param saved: what :meth:`read_profile` returned before the profile was applied, as the
            daemon stored it (possibly by a process that has since crashed).
        :returns: each setting it restored and every error, which are returned, never raised.
        """
        raise PluginError(
            f"this translator applies no GPU profile (asked for tenant {tenant!r}); "
            "use a kind whose actions include profile, such as gpu_profile"
        )


class Probe(_Kind):
    """Says whether a GPU API is usable on this host, with evidence."""

    def __init__(self, options: KindOptions, context: PluginContext) -> None:
        self.options = options
        self.context = context

    def probe(self) -> tuple[bool, str]:
        raise NotImplementedError


class HostSignal(_Kind):
    """A host signal (available memory, power source, sleep) as a value."""

    def __init__(self, options: KindOptions, context: PluginContext) -> None:
        self.options = options
        self.context = context

    def read(self) -> Any:
        raise NotImplementedError
