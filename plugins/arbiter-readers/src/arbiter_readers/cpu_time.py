"""``cpu_time``: each process's CPU time, read as if it were GPU busy time.

A stand-in for demos and tests on hosts without a readable GPU.  It never counts unless
the node config says ``stand_in_gpu: true``: a CPU reading must not silently stand in
for a GPU reader that failed.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Collection
from typing import Literal

import psutil
from arbiter.plugin import GpuReading, KindOptions, ProcessGpu, Reader
from pydantic import Field

NOT_ALLOWED = "cpu_time is a stand-in for a GPU and counts only with stand_in_gpu: true in the node config"
ENGINE = "cpu"
_LINUX = sys.platform.startswith("linux")


def _proc_stat_busy_ns(pid: int, ns_per_tick: float) -> int | None:
    """utime + stime from ``/proc/PID/stat`` (fields 14 and 15), or None when it is gone or a zombie.

    One read per process: psutil takes about five times as long for the same numbers, and
    the daemon reads every protected process and job on each tick.
    """
    return _proc_stat_busy_ns_path(f"/proc/{pid}/stat", ns_per_tick)


def _proc_stat_busy_ns_path(path: str, ns_per_tick: float) -> int | None:
    # os.open/os.read rather than a buffered file object: with a thousand processes under
    # rules this runs a thousand times a tick, and the file object cost as much as the read
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)  # a stat line is a few hundred bytes
    except OSError:
        return None
    finally:
        os.close(fd)
    fields = data[data.rfind(b")") + 2 :].split(None, 13)  # the name in parentheses may hold spaces
    if len(fields) < 13 or fields[0] == b"Z":
        return None
    return round((int(fields[11]) + int(fields[12])) * ns_per_tick)


def _threads_busy_ns(pid: int, ns_per_tick: float) -> dict[str, int]:
    """Each thread's utime + stime, as engine ``thread:<tid>``."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        busy = _proc_stat_busy_ns_path(f"/proc/{pid}/task/{tid}/stat", ns_per_tick)
        if busy is not None:
            out[f"thread:{tid}"] = busy
    return out


class CpuTimeOptions(KindOptions):
    kind: Literal["cpu_time"] = "cpu_time"
    threads: bool = Field(False, description="count each thread as its own engine, so the busiest thread is the "
                                             "measure (a job whose units run on one thread beside others)")


class CpuTimeReader(Reader):
    """Reports user + system CPU time of each process as busy time on engine ``cpu``."""

    Options = CpuTimeOptions
    stand_in = True

    def read(self, pids: Collection[int]) -> GpuReading:
        if not self.context.stand_in_gpu:
            return GpuReading(readable=False, at_ns=time.monotonic_ns(), device="cpu", why=NOT_ALLOWED)
        at_ns = time.monotonic_ns()
        processes: dict[int, ProcessGpu] = {}
        if _LINUX:
            ns_per_tick = 1e9 / os.sysconf("SC_CLK_TCK")
            for pid in pids:
                if self.options.threads:  # type: ignore[attr-defined]
                    engines = _threads_busy_ns(pid, ns_per_tick)
                    if engines:
                        processes[pid] = ProcessGpu(busy_ns=engines)
                    continue
                busy = _proc_stat_busy_ns(pid, ns_per_tick)
                if busy is not None:
                    processes[pid] = ProcessGpu(busy_ns={ENGINE: busy})
            return GpuReading(readable=True, at_ns=at_ns, device="cpu", processes=processes)
        for pid in pids:
            try:
                proc = psutil.Process(pid)
                with proc.oneshot():
                    if proc.status() == psutil.STATUS_ZOMBIE:
                        continue  # exited, not yet reaped: no longer a process to account
                    times = proc.cpu_times()
            except psutil.Error:
                continue  # gone, or not ours to read: it reads as absent, like a GPU reader's
            if self.options.threads:  # type: ignore[attr-defined]
                try:
                    threads = proc.threads()
                except psutil.Error:
                    continue
                processes[pid] = ProcessGpu(busy_ns={f"thread:{t.id}": round((t.user_time + t.system_time) * 1e9) for t in threads})
                continue
            busy_ns = round((times.user + times.system) * 1e9)
            processes[pid] = ProcessGpu(busy_ns={ENGINE: busy_ns})
        return GpuReading(readable=True, at_ns=at_ns, device="cpu", processes=processes)
