"""``cpu_time``: each process's CPU time, read as if it were GPU busy time.

A stand-in for demos and tests on hosts without a readable GPU.  Busy is time on a CPU, as
it is for a job holding a duty on the CPU (``arbiter.sdk.Duty(device="cpu")`` times each
unit by its thread's CPU time): time spent waiting for a CPU, after an idle or in a unit,
is counted by neither.  It never counts unless
the node config says ``stand_in_gpu: true``: a CPU reading must not silently stand in
for a GPU reader that failed.  The daemon's process table holds each process's CPU time,
and the reading is taken from it; where it does not (or for each thread), a child worker
reads ``/proc`` on Linux (see :mod:`arbiter_readers._cpustat`), psutil elsewhere.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Collection, Mapping
from typing import Any, Literal

import psutil
from pydantic import Field

from arbiter.plugin import (
    EXITED,
    ChildWorker,
    ChildWorkFailed,
    GpuReading,
    KindOptions,
    PluginContext,
    ProcessGpu,
    ProcessInfo,
    Reader,
    open_file_share,
)
from arbiter_readers import _cpustat
from arbiter_readers._cpustat import BusyTimes, Request

NOT_ALLOWED = "cpu_time is a stand-in for a GPU and counts only with stand_in_gpu: true in the node config"
ENGINE = "cpu"
_LINUX = sys.platform.startswith("linux")
#: a reading of at most this many processes (each as a whole) is read in the daemon's process
READ_HERE_MOST = 16


def _well_formed(answer: object) -> bool:
    """Whether the child's answer is one :class:`~arbiter_readers._cpustat.BusyTimes` gives to
    a request naming the answer held: its time, busy times, its number, the number it is
    told against, the pids gone."""
    if type(answer) is not tuple or len(answer) != 5 or type(answer[0]) is not int or type(answer[1]) is not dict:
        return False
    if type(answer[2]) is not int or type(answer[3]) is not int or type(answer[4]) is not list:
        return False
    if not all(type(pid) is int for pid in answer[4]):
        return False
    for pid, busy in answer[1].items():
        if type(pid) is not int:
            return False
        if type(busy) is dict:
            if not all(type(k) is str and type(v) is int for k, v in busy.items()):
                return False
        elif type(busy) is not int:
            return False
    return True


class CpuTimeOptions(KindOptions):
    kind: Literal["cpu_time"] = "cpu_time"
    threads: bool = Field(
        False,
        description="count each thread as its own engine, so the busiest thread is the "
        "measure (a job whose units run on one thread beside others)",
    )


class CpuTimeReader(Reader):
    """Reports user + system CPU time of each process as busy time on engine ``cpu``."""

    Options = CpuTimeOptions
    stand_in = True

    def __init__(self, options: CpuTimeOptions, context: PluginContext) -> None:
        super().__init__(options, context)
        self.options: CpuTimeOptions = options
        self._lock = threading.Lock()
        keep = open_file_share(4, 4096) if _LINUX else 0
        self._busy = BusyTimes(keep)
        # the reads run in a child, out of the daemon's interpreter; here when it fails
        self._child = ChildWorker(_cpustat.__file__, "BusyTimes", keep) if _LINUX else None
        self._last: dict[int, ProcessGpu] = {}  # the last reading's, reused while unchanged
        #: the child's last answer as a whole (its number, the busy times), and whether
        #: ``_last`` was built from it
        self._told: tuple[int, dict[int, Any]] | None = None
        self._last_told = False

    def close(self) -> None:
        if self._child is not None:
            self._child.close()
        self._busy.close()

    def read(self, pids: Collection[int]) -> GpuReading:
        if not self.context.stand_in_gpu:
            return GpuReading(readable=False, at_ns=time.monotonic_ns(), device="cpu", why=NOT_ALLOWED)
        at_ns = time.monotonic_ns()
        if _LINUX:
            request = (list(pids), bool(self.options.threads))
            with self._lock:
                # a few processes' stat files cost less to read here than a hand-over to the
                # child: it starts only once a reading is worth it
                told = None if len(request[0]) <= READ_HERE_MOST and not request[1] else self._from_child(request)
                if told is not None:
                    read_at_ns, read = told
                else:
                    read_at_ns, busy = self._busy(request)
                    read = self._processes(busy)
                    self._last_told = False
            return GpuReading(readable=True, at_ns=read_at_ns, device="cpu", processes=read)
        processes: dict[int, ProcessGpu] = {}
        for pid in pids:
            try:
                proc = psutil.Process(pid)
                with proc.oneshot():
                    if proc.status() == psutil.STATUS_ZOMBIE:
                        continue  # exited, not yet reaped: no longer a process to account
                    times = proc.cpu_times()
            except psutil.Error:
                continue  # gone, or not ours to read: it reads as absent, like a GPU reader's
            if self.options.threads:
                try:
                    threads = proc.threads()
                except psutil.Error:
                    continue
                processes[pid] = ProcessGpu(
                    busy_ns={f"thread:{t.id}": round((t.user_time + t.system_time) * 1e9) for t in threads}
                )
                continue
            busy_ns = round((times.user + times.system) * 1e9)
            processes[pid] = ProcessGpu(busy_ns={ENGINE: busy_ns})
        return GpuReading(readable=True, at_ns=at_ns, device="cpu", processes=processes)

    def read_table(self, processes: Mapping[int, ProcessInfo], at_ns: int) -> GpuReading | None:
        """From the CPU times the process table read (on Linux, from the same ``stat`` line
        this reader would read again): a thousand processes' reads spared each tick."""
        if not self.context.stand_in_gpu or self.options.threads:
            return None  # the refusal, or each thread's time, which the table has not
        busy: dict[int, int] = {}
        for pid, info in processes.items():
            if info.cpu_ns is None:
                return None
            if info.state != EXITED:  # no longer a process to account
                busy[pid] = info.cpu_ns
        with self._lock:
            self._last_told = False
            return GpuReading(readable=True, at_ns=at_ns, device="cpu", processes=self._processes(busy))

    def _from_child(self, request: Request) -> tuple[int, dict[int, ProcessGpu]] | None:
        """The child's reading (when it began, each process's record), asked as what changed
        since the answer held; None where the child cannot give it."""
        if self._child is None:
            return None
        held = self._told
        try:
            answer = self._child.call((*request, -1 if held is None else held[0]))
        except ChildWorkFailed:
            self._told = None  # a child started later knows nothing of what was held
            return None  # the worker keeps why, and starts another child later
        if not _well_formed(answer):
            self._child.give_up(f"it answered something other than busy times: {str(answer)[:80]}")
            self._told = None
            return None
        at_ns, busy, number, base, gone = answer
        if base == -1:
            self._told = (number, busy)
            processes = self._processes(busy)
        elif held is not None and base == held[0]:
            whole = dict(held[1])
            whole.update(busy)
            for pid in gone:
                whole.pop(pid, None)
            self._told = (number, whole)
            processes = self._changed(busy, gone) if self._last_told else self._processes(whole)
        else:
            self._child.give_up(f"it answered against answer {base}, not the one held ({held and held[0]})")
            self._told = None
            return None
        self._last_told = True
        return at_ns, processes

    def _changed(self, busy: dict[int, Any], gone: list[int]) -> dict[int, ProcessGpu]:
        """The last reading's records, with those of the processes that changed made anew."""
        processes = dict(self._last)
        for pid in gone:
            processes.pop(pid, None)
        for pid, times in busy.items():
            processes[pid] = ProcessGpu(busy_ns=times if type(times) is dict else {ENGINE: times})
        self._last = processes
        return processes

    def _processes(self, answer: dict[int, Any]) -> dict[int, ProcessGpu]:
        last, processes = self._last, {}
        for pid, busy in answer.items():
            engines = busy if type(busy) is dict else {ENGINE: busy}
            before = last.get(pid)
            processes[pid] = before if before is not None and before.busy_ns == engines else ProcessGpu(busy_ns=engines)
        self._last = processes
        return processes
