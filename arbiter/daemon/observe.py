"""The slow half of observing, run on the tick: processes, who they belong to, GPU time.

It runs past 400 lines because one tick's view is built in one pass: the process table, the
claims, the readers and the jobs' shares each feed the next.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

from arbiter.config.models import KindBlock, NodeConfig
from arbiter.daemon.claim import Claimer, descendants, plausible
from arbiter.daemon.exits import ExitWatching
from arbiter.daemon.jobevents import JobEventLog, JobReport
from arbiter.daemon.rules import LiveRule, RuleBook
from arbiter.engine.types import RuleObs
from arbiter.engine.usage import BusyCounters, busy_share
from arbiter.plugin import EXITED, GpuReading, HostSignal, ProcessGpu, ProcessInfo, ProcessRef, Reader
from arbiter.pluginmanager import PluginFailed, PluginHost
from arbiter.pluginsteps import Step, Steps, one
from arbiter.state.store import JobRecord


@dataclass(frozen=True)
class TickView:
    """What one tick saw, before sources' phases are laid over it."""

    now: float
    rules: Mapping[str, RuleObs]
    job_processes: Mapping[str, tuple[ProcessRef, ...]]  # job id → its process tree, root first
    job_busy: Mapping[str, float | None]  # job id → measured busy share (None: unreadable)
    alive: frozenset[int]  # every pid in the table that has not exited, to notice vanished launchers
    reader: str  # the reader that read, or "" when none could
    reader_why: str
    table_size: int
    scan_s: float
    faults: tuple[str, ...] = ()
    vram: Mapping[str, int | None] = field(default_factory=dict)
    job_vram: Mapping[str, int | None] = field(default_factory=dict)  # job id → what its processes hold
    rule_uids: Mapping[str, frozenset[int]] = field(default_factory=dict)  # who runs each rule's program
    #: when job_busy was sampled (seconds, monotonic); None on a first reading (no interval yet)
    job_busy_at: float | None = None
    rule_exes: Mapping[str, str] = field(default_factory=dict)  # rule id → its program's executable
    memory_available: float | None = None  # share of host memory (the ``memory`` host signal)
    power: str | None = None  # the host's power source (the ``power`` host signal)
    machine: Mapping[str, Any] = field(default_factory=dict)  # the ``machine`` host signal, as a dict
    gpus: tuple[str, ...] = ()  # the GPUs the reader read, by name
    driver: str = ""  # the GPU driver the reader reports, with its version ("" where none)
    reader_faults: tuple[str, ...] = ()  # readers that raised, hung or returned garbage (not "cannot read")
    clock_jump_s: float | None = None  # how far the wall clock jumped since the last tick, if it did
    job_reports: Mapping[str, JobReport] = field(default_factory=dict)  # what each job says in its events file


#: the wall clock moving this much more (or less) than the monotonic one over one tick was
#: set, or the machine slept: decisions run on the monotonic clock, but timestamps jump
CLOCK_JUMP_S = 30.0


def clock_jump_message(jump_s: float) -> str:
    way = "forward" if jump_s > 0 else "back"
    return (
        f"the wall clock jumped {way} by {abs(jump_s):.0f}s (set by hand or by time sync, or the machine slept): "
        "holds, grace periods and budgets run on the monotonic clock and did not move; timeline times jump with it"
    )


#: busy time or VRAM beyond these is no GPU's: a reader that says so is broken (31 years; 1 EiB)
IMPLAUSIBLE_NS = 10**18
IMPLAUSIBLE_BYTES = 1 << 60


def reading_problem(reading: object, checked: Mapping[int, ProcessGpu] | None = None) -> str:
    """What is wrong with what a reader returned, or "": garbage (NaN, negative, another
    type) must never read as an idle GPU, so a reading with any of it counts as no reading.
    ``checked``: the processes of the last reading that passed; one handed back as the very
    same record (a reader keeps an idle process's) is not checked again."""
    if not isinstance(reading, GpuReading):
        return f"it returned {type(reading).__name__}, not a GpuReading"
    if not reading.readable:
        return ""
    if not isinstance(reading.at_ns, int) or isinstance(reading.at_ns, bool):
        return f"at_ns is {reading.at_ns!r}, not an integer of nanoseconds"
    if not isinstance(reading.processes, Mapping):
        return f"processes is {type(reading.processes).__name__}, not a mapping of pid to ProcessGpu"
    known = checked or {}
    for pid, pg in reading.processes.items():
        if known.get(pid) is pg:
            continue
        if not isinstance(pg, ProcessGpu) or not isinstance(pg.busy_ns, Mapping):
            return f"process {pid!r}: {pg!r} is not a ProcessGpu"
        for engine, ns in pg.busy_ns.items():
            if not plausible(ns, IMPLAUSIBLE_NS):
                return f"process {pid}: busy_ns[{engine!r}] is {ns!r}, not nanoseconds from 0 to {IMPLAUSIBLE_NS:g}"
        if pg.vram_bytes is not None and not plausible(pg.vram_bytes, IMPLAUSIBLE_BYTES):
            return f"process {pid}: vram_bytes is {pg.vram_bytes!r}, not a byte count"
    for key in ("vram_total_bytes", "vram_free_bytes"):
        value = getattr(reading, key)
        if value is not None and not plausible(value, IMPLAUSIBLE_BYTES):
            return f"{key} is {value!r}, not a byte count"
    return ""


def held_vram(reading: GpuReading | None, pids: Iterable[int], unknown: Collection[int] | None = None) -> int | None:
    """What these processes hold (None: the readers cannot say).  ``unknown``: the pids the
    reading lists without their VRAM, where the caller asks about many sets of processes."""
    if reading is None:
        return None
    pids = set(pids)
    if pids & reading.unreadable:
        return None
    if unknown is not None:
        if not pids.isdisjoint(unknown):
            return None  # a process listed without its VRAM: unknown, never 0 (nor "unmanaged")
        return sum(pg.vram_bytes or 0 for pid in pids if (pg := reading.processes.get(pid)) is not None)
    # by the pids, not the reading: it is called for every rule, most with no process
    mine = [pg.vram_bytes for pid in pids if (pg := reading.processes.get(pid)) is not None]
    if any(v is None for v in mine):
        return None  # a process listed without its VRAM: unknown, never 0 (nor "unmanaged")
    return sum(v or 0 for v in mine)


def _read_one(reader: Reader, pids: set[int], processes: Mapping[int, ProcessInfo], at_ns: int) -> GpuReading:
    """One reader's reading: taken from the process table where it can, read where not."""
    if len(processes) == len(pids):  # every pid is in the table, as every pid a tick asks about is
        taken = reader.read_table(processes, at_ns)
        if taken is not None:
            return taken
    return reader.read(pids)


class Observer:
    def __init__(self, config: NodeConfig, host: PluginHost) -> None:
        self.config = config
        self.host = host
        self.claimer = Claimer(host.call)
        self.readers: list[tuple[str, Reader | None, str]] = []
        context = host.context(config)
        installed = {name: info.cls for name in host.kind_names("readers") if (info := host.kind("readers", name))}
        blocks = config.reader_blocks() or [
            KindBlock(kind=name)
            for name in sorted(installed, key=lambda n: (installed[n].preference, n))
            if not installed[name].stand_in and installed[name].reads_here()
        ]
        for block in blocks:
            info = host.kind("readers", block.kind)
            if info is None:
                self.readers.append((block.kind, None, "no installed plugin registers this reader"))
                continue
            if info.cls.stand_in and not config.stand_in_gpu:
                self.readers.append((block.kind, None, "a stand-in reader counts only with stand_in_gpu: true"))
                continue
            try:
                options = info.cls.Options.model_validate(block.options())
                self.readers.append((block.kind, host.call(f"readers/{block.kind}", info.cls, options, context), ""))
            except (PluginFailed, ValueError) as exc:
                self.readers.append((block.kind, None, str(exc)))
        self._prev: GpuReading | None = None
        self._prev_reader = ""
        self._prev_counters: BusyCounters = {}  # each process's counters in ``_prev``
        self._signals: dict[str, HostSignal | None] = {}
        self._sample_base: tuple[str, GpuReading] | None = None  # where the current job sample began
        self.reader_results: dict[str, tuple[bool, str]] = {}
        self._job_busy: dict[str, float | None] = {}  # the last job sample
        self._machine_reading: dict[str, Any] | None = None
        self.reader_faults: list[str] = []
        self._scan_lock = threading.Lock()
        self.job_events = JobEventLog()
        self._table_scratch: dict[str, Any] = {}  # the process table plugin's memory between scans
        self.exits = ExitWatching(host, self._table_scratch)
        self._last_scan: tuple[float, list[ProcessInfo], int] | None = (
            None  # (when its read began, the table, its at_ns)
        )
        self._clock_offset: float | None = None  # wall − monotonic on the last tick
        self.clock_jump: tuple[float, float] | None = None  # (monotonic time, seconds) of the last jump

    def _clock(self) -> float | None:
        offset = time.time() - time.monotonic()
        before, self._clock_offset = self._clock_offset, offset
        if before is None or abs(offset - before) < CLOCK_JUMP_S:
            return None
        self.clock_jump = (time.monotonic(), offset - before)
        return offset - before

    @property
    def table_about(self) -> str:
        """How the process table plugin reads the table now ("" where it does not say)."""
        about = self._table_scratch.get("about")
        return about if isinstance(about, str) else ""

    def process_table(self) -> list[ProcessInfo]:
        """The host's processes, read after this call began."""
        return self.host.run_steps(self._read_table())[0]

    def reading_table(self) -> Steps[list[ProcessInfo]]:
        """:meth:`process_table` as steps, for a caller within a run."""
        table, _ = yield from self._read_table()
        return table

    def _read_table(self) -> Steps[tuple[list[ProcessInfo], int]]:
        """The host's processes, read after this call began, and the monotonic ns halfway
        through their read.  One read at a time: callers that waited for another's read take
        the next one together (fifty jobs registering at once once read it fifty times over
        and starved the tick past its timeout)."""
        asked = time.monotonic()
        with self._scan_lock:
            last = self._last_scan
            if last is not None and last[0] >= asked:
                return list(last[1]), last[2]
            started, started_ns = time.monotonic(), time.monotonic_ns()
            table = yield from one(
                "process table", lambda: self.host.hook.arbiter_process_table(scratch=self._table_scratch)
            )
            if table is None:
                raise PluginFailed("process table", "no installed plugin provides arbiter_process_table")
            at_ns = (started_ns + time.monotonic_ns()) // 2
            self._last_scan = (started, list(table), at_ns)
            return list(table), at_ns

    def watching_processes(
        self, view: TickView, rulebook: RuleBook, tick_s: float, soon: Callable[[], None]
    ) -> Steps[None]:
        """See :meth:`arbiter.daemon.exits.ExitWatching.watching` (a start brings forward at
        most one tick in ``tick_s``)."""
        if not view.faults:  # a table that could not be read says nothing about who runs
            yield from self.exits.watching(
                view.rules, list(rulebook.live.values()), frozenset({os.getpid()}), tick_s, soon
            )

    def _read_gpu(
        self, pids: set[int], processes: Mapping[int, ProcessInfo], at_ns: int
    ) -> Steps[tuple[str, GpuReading | None, str]]:
        """(name, reading, note) of the first reader that reads, taken from ``processes``
        (this tick's table, read at ``at_ns``) where that reader can; ("", None, why) when
        none reads."""
        whys = []
        self.reader_faults = []
        results: dict[str, tuple[bool, str]] = {}
        try:
            for name, reader, why in self.readers:
                if reader is None:
                    whys.append(f"{name}: {why}")
                    results[name] = (False, f"not loaded: {why}")
                    continue
                try:
                    reading = yield Step(f"readers/{name}", _read_one, (reader, pids, processes, at_ns))
                except PluginFailed as exc:
                    whys.append(f"{name}: {exc.why}")
                    results[name] = (False, f"failed: {exc.why}")
                    self.reader_faults.append(f"readers/{name}: {exc.why}")
                    continue
                problem = reading_problem(reading, self._prev.processes if self._prev is not None else None)
                if problem:
                    whys.append(f"{name}: returned garbage: {problem}")
                    results[name] = (False, f"returned garbage: {problem}")
                    self.reader_faults.append(f"readers/{name}: returned garbage: {problem}")
                    continue
                if reading.readable:
                    results[name] = (
                        (True, "reads CPU time, standing in for GPU time (stand_in_gpu: true, for demos and tests)")
                        if type(reader).stand_in
                        else (True, "reads GPU time (in use)")
                    )
                    return name, reading, reading.why
                whys.append(f"{name}: {reading.why or 'cannot read'}")
                results[name] = (False, f"cannot read: {reading.why or 'no reason given'}")
            return "", None, "; ".join(whys) or "no reader configured (readers: in arbiter.yaml)"
        finally:
            # for `arbiter doctor`: what each reader said on the last tick (later ones go untried)
            self.reader_results = {
                n: results.get(n, (True, "not tried: an earlier reader reads")) for n, _, _ in self.readers
            }

    def observe(self, rulebook: RuleBook, jobs: Sequence[JobRecord], own_pids: Iterable[int]) -> TickView:
        """What the tick sees now, its plugin calls handed to the pool together."""
        return self.host.run_steps(self.observing(rulebook, jobs, own_pids))

    def observing(self, rulebook: RuleBook, jobs: Sequence[JobRecord], own_pids: Iterable[int]) -> Steps[TickView]:
        """:meth:`observe` as steps, for a caller that runs more of its own with them."""
        started = time.monotonic()
        faults: list[str] = []
        table_at_ns = 0
        try:
            table, table_at_ns = yield from self._read_table()
        except PluginFailed as exc:
            table = []
            faults.append(str(exc))
        by_pid = {p.pid: p for p in table}
        roots = {j.id: j.root_pid for j in jobs if j.root_pid is not None}
        trees = descendants(table, roots.values())
        job_processes: dict[str, tuple[ProcessRef, ...]] = {}
        fleet: set[int] = set(own_pids) | {j.launcher_pid for j in jobs}
        for job in jobs:
            root = roots.get(job.id)
            info = by_pid.get(root) if root is not None else None
            if root is None or info is None or not job.rooted_at(info.pid, info.start_time):
                job_processes[job.id] = ()
                continue
            refs = tuple(by_pid[p].ref for p in trees[root] if p in by_pid)
            job_processes[job.id] = refs
            fleet.update(r.pid for r in refs)

        ended = self.exits.ended(table)
        ordered = rulebook.ordered()
        rule_pids, rule_faults = yield from self.claimer.claiming(
            ordered, [p for p in table if p.pid not in fleet and p.pid not in ended]
        )
        yield from self._feed_process_sources(ordered, table, rule_faults)
        wanted = set().union(*rule_pids.values(), *({r.pid for r in refs} for refs in job_processes.values()))
        in_table = {pid: by_pid[pid] for pid in wanted if pid in by_pid}
        reader_name, reading, reader_why = yield from self._read_gpu(wanted, in_table, table_at_ns)
        before: BusyCounters | None = None
        if reading is not None and self._prev is not None and self._prev_reader == reader_name:
            before = self._prev_counters
        after: BusyCounters = {pid: pg.busy_ns for pid, pg in reading.processes.items()} if reading else {}
        # the processes whose counters moved since the last reading (a reader hands back the
        # very same counters for an idle one): a rule with none of them used no GPU time, and
        # most of a hundred rules' thousand processes are idle on most ticks
        moved = {pid for pid, now in after.items() if before.get(pid) is not now} if before is not None else set()
        vram_unknown = (
            {pid for pid, pg in reading.processes.items() if pg.vram_bytes is None} if reading is not None else set()
        )

        def share(pids: frozenset[int]) -> float | None:
            if reading is None or self._prev is None or pids & reading.unreadable:
                return None  # a process whose GPU time cannot be read may be using it
            if before is not None and reading.at_ns > self._prev.at_ns and pids.isdisjoint(moved):
                return 0.0  # what busy_share says of counters none of which moved
            return busy_share(before, self._prev.at_ns, after, reading.at_ns, pids)

        rules: dict[str, RuleObs] = {}
        for live in ordered:
            rid = live.rule.id
            pids = rule_pids[rid]
            running = bool(pids)
            gpu_share = share(pids) if running else 0.0
            why = ""
            if gpu_share is None:
                if reading is None:
                    why = reader_why
                elif self._prev is None:
                    why = "first reading: no interval yet"
                else:
                    why = f"{reader_name} cannot read process(es) {sorted(pids & reading.unreadable)}"
            rules[rid] = RuleObs(
                rid,
                running,
                pids,
                gpu_share,
                why,
                (),
                tuple(rule_faults[rid]),
                vram_bytes=held_vram(reading, pids, vram_unknown),
            )
        job_busy, busy_at = self._job_sample(reader_name, reading, job_processes)
        if reading is not None:
            self._prev, self._prev_reader, self._prev_counters = reading, reader_name, after
        else:
            self._prev, self._prev_reader, self._prev_counters = None, "", {}
        vram: dict[str, int | None] = (
            {"total": reading.vram_total_bytes, "free": reading.vram_free_bytes} if reading else {}
        )
        job_vram = (
            {jid: held_vram(reading, {r.pid for r in refs}, vram_unknown) for jid, refs in job_processes.items()}
            if reading
            else {}
        )
        if reading is not None:
            vram["jobs"] = sum(held or 0 for held in job_vram.values())
        return TickView(
            now=time.monotonic(),
            rules=rules,
            job_processes=job_processes,
            job_busy=job_busy,
            # a launcher that has exited stays in the table until its parent waits for it: gone
            # all the same (only a launcher: a program's first thread can exit while others run)
            alive=frozenset({pid for pid, info in by_pid.items() if info.state != EXITED}),
            reader=reader_name,
            reader_why=reader_why,
            table_size=len(table),
            scan_s=time.monotonic() - started,
            faults=tuple(faults),
            vram=vram,
            job_vram=job_vram,
            job_busy_at=busy_at,
            rule_exes={rid: by_pid[min(pids)].exe for rid, pids in rule_pids.items() if pids and min(pids) in by_pid},
            memory_available=(yield from self._memory()),
            power=(yield from self._power()),
            machine=(yield from self._machine()),
            gpus=reading.devices if reading else (),
            driver=reading.driver if reading else "",
            rule_uids={rid: frozenset(by_pid[p].uid for p in pids if p in by_pid) for rid, pids in rule_pids.items()},
            reader_faults=tuple(self.reader_faults),
            clock_jump_s=self._clock(),
            job_reports=self.job_events.read({j.id: j.events_path for j in jobs}),
        )

    def _job_sample(
        self, reader_name: str, reading: GpuReading | None, job_processes: Mapping[str, tuple[ProcessRef, ...]]
    ) -> tuple[dict[str, float | None], float | None]:
        """Each job's measured duty over one compliance sample (``compliance.sample_s``, 2 s,
        whatever the tick), and when it was taken; between samples, the last one and None."""
        if reading is None:
            self._sample_base = None
            # unreadable is news at once: a job at a duty below 1 is held on this tick
            return {jid: None for jid in job_processes}, time.monotonic()
        base = self._sample_base
        if base is None or base[0] != reader_name or reading.at_ns < base[1].at_ns:
            self._sample_base = (reader_name, reading)
            return self._job_busy, None  # the first reading of a sample: nothing measured yet
        if reading.at_ns - base[1].at_ns < self.config.compliance.sample_s * 1e9:
            return self._job_busy, None
        then = {pid: pg.busy_ns for pid, pg in base[1].processes.items()}
        now = {pid: pg.busy_ns for pid, pg in reading.processes.items()}
        busy: dict[str, float | None] = {}
        for jid, refs in job_processes.items():
            pids = {r.pid for r in refs}
            if not refs:
                busy[jid] = 0.0
            elif pids & reading.unreadable:
                busy[jid] = None
            else:
                busy[jid] = busy_share(then, base[1].at_ns, now, reading.at_ns, pids)
        self._sample_base = (reader_name, reading)
        self._job_busy = busy
        return busy, reading.at_ns / 1e9

    def host_signal(self, kind: str) -> Any:
        """The reading of a host signal plugin, or None where none is installed or it fails."""
        return self.host.run_steps(self._signal(kind))

    def _signal(self, kind: str) -> Steps[Any]:
        if kind not in self._signals:
            info = self.host.kind("host", kind)
            model = self.host.options_model("host", kind)
            context = self.host.context(self.config)
            try:
                self._signals[kind] = (
                    None
                    if info is None or model is None
                    else (yield Step(f"host/{kind}", info.cls, (model(), context)))
                )
            except PluginFailed:
                self._signals[kind] = None
        signal = self._signals[kind]
        if signal is None:
            return None
        try:
            return (yield Step(f"host/{kind}", signal.read))
        except PluginFailed:
            return None

    def _memory(self) -> Steps[float | None]:
        reading = yield from self._signal("memory")
        share = getattr(reading, "available_share", None)
        return float(share) if isinstance(share, (int, float)) else None

    def _power(self) -> Steps[str | None]:
        source = getattr((yield from self._signal("power")), "source", None)
        return source if isinstance(source, str) else None

    def _machine(self) -> Steps[dict[str, Any]]:
        if self._machine_reading is None:  # the node does not change while the daemon runs
            reading = yield from self._signal("machine")
            is_record = is_dataclass(reading) and not isinstance(reading, type)
            self._machine_reading = asdict(reading) if is_record else {}
        return self._machine_reading

    def _feed_process_sources(
        self, ordered: Sequence[LiveRule], table: Sequence[ProcessInfo], faults: dict[str, list[str]]
    ) -> Steps[None]:
        """Sources that watch processes (``on_exec``) see every process their block selects;
        a failure is a fault of the rule (treated as harm)."""
        for live in ordered:
            for index, matcher in list(live.source_matchers.items()):
                source = live.progress if index < 0 else live.phases[index]
                if source is None:
                    continue
                label = f"sources/{live.rule.id}/{'progress' if index < 0 else f'during.{index}'}"
                try:
                    chosen = yield Step(f"{label} match", matcher.select, (table,))
                    yield Step(label, source.processes, (frozenset(chosen),))
                except PluginFailed as exc:
                    faults.setdefault(live.rule.id, []).append(str(exc))

    def close(self) -> None:
        self.job_events.close()
        self.host.close_scratch(self._table_scratch)
        for name, reader, _ in self.readers:
            if reader is not None:
                try:
                    self.host.call(f"readers/{name} close", reader.close, timeout=2)
                except PluginFailed:
                    pass
