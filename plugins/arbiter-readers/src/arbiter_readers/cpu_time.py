"""``cpu_time``: each process's CPU time, read as if it were GPU busy time.

A stand-in for demos and tests on hosts without a readable GPU.  It never counts unless
the node config says ``stand_in_gpu: true``: a CPU reading must not silently stand in
for a GPU reader that failed.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Collection
from typing import Literal

import psutil
from arbiter.plugin import GpuReading, KindOptions, PluginContext, ProcessGpu, Reader, open_file_share
from pydantic import Field


NOT_ALLOWED = "cpu_time is a stand-in for a GPU and counts only with stand_in_gpu: true in the node config"
ENGINE = "cpu"
_LINUX = sys.platform.startswith("linux")


def _busy_ns_of(data: bytes | None, ns_per_tick: float) -> int | None:
    """utime + stime (fields 14 and 15) of a ``stat`` line, or None when there is none or
    it is a zombie's."""
    if not data:
        return None
    fields = data[data.rfind(b")") + 2 :].split(None, 13)  # the name in parentheses may hold spaces
    if len(fields) < 13 or fields[0] == b"Z":
        return None
    return round((int(fields[11]) + int(fields[12])) * ns_per_tick)


class _StatFiles:
    """``/proc/PID/stat`` descriptors kept open between reads and read again with one
    ``pread``: the daemon reads every protected process and job on each tick, and the open
    and close cost more than the read.  A kept descriptor names its process, never a later
    one with the same pid: once the process is gone it reads nothing, and is closed.  At
    most ``limit`` are kept (a share of the open-file limit); the rest are opened per read."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.fds: dict[int, int] = {}

    def read(self, pid: int) -> bytes | None:
        fd = self.fds.get(pid)
        if fd is not None:
            try:
                data = os.pread(fd, 4096, 0)  # a stat line is a few hundred bytes
            except OSError:
                data = b""
            if data:
                return data
            del self.fds[pid]
            os.close(fd)
            return None  # gone (a new process under its pid is opened afresh on the next read)
        path = f"/proc/{pid}/stat"
        if len(self.fds) >= self.limit:
            return _read_once(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            data = os.read(fd, 4096)
        except OSError:
            data = b""
        if data:
            self.fds[pid] = fd
        else:
            os.close(fd)
        return data or None

    def keep_only(self, pids: Collection[int]) -> None:
        """Close what was kept for pids no longer asked about."""
        for pid in [p for p in self.fds if p not in pids]:
            os.close(self.fds.pop(pid))

    def close(self) -> None:
        self.keep_only(())



def _read_once(path: str) -> bytes | None:
    # os.open/os.read rather than a buffered file object: with a thousand processes under
    # rules this runs a thousand times a tick, and the file object cost as much as the read
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)  # a stat line is a few hundred bytes
    except OSError:
        return None
    finally:
        os.close(fd)


def _threads_busy_ns(pid: int, ns_per_tick: float) -> dict[str, int]:
    """Each thread's utime + stime, as engine ``thread:<tid>``."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        busy = _busy_ns_of(_read_once(f"/proc/{pid}/task/{tid}/stat"), ns_per_tick)
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

    def __init__(self, options: KindOptions, context: PluginContext) -> None:
        super().__init__(options, context)
        self._lock = threading.Lock()
        self._files = _StatFiles(open_file_share(4, 4096) if _LINUX else 0)

    def __del__(self) -> None:
        self._files.close()

    def read(self, pids: Collection[int]) -> GpuReading:
        if not self.context.stand_in_gpu:
            return GpuReading(readable=False, at_ns=time.monotonic_ns(), device="cpu", why=NOT_ALLOWED)
        at_ns = time.monotonic_ns()
        processes: dict[int, ProcessGpu] = {}
        if _LINUX:
            ns_per_tick = 1e9 / os.sysconf("SC_CLK_TCK")
            if self.options.threads:  # type: ignore[attr-defined]
                for pid in pids:
                    engines = _threads_busy_ns(pid, ns_per_tick)
                    if engines:
                        processes[pid] = ProcessGpu(busy_ns=engines)
                return GpuReading(readable=True, at_ns=at_ns, device="cpu", processes=processes)
            with self._lock:
                asked = set(pids)
                self._files.keep_only(asked)
                for pid in asked:
                    busy = _busy_ns_of(self._files.read(pid), ns_per_tick)
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
