"""Each process's CPU time from ``/proc``, in the daemon or in a child worker of its own.

This module uses the standard library only, so that a child worker
(:class:`arbiter.plugin.ChildWorker`) can run it without importing anything else: with a
thousand processes under rules the reads take about 13 ms of Python a tick, and in the
daemon's interpreter its fast path would wait for them.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Collection

#: a request: (the pids, whether each thread is its own engine); the answer is (when the reads
#: began, by CLOCK_MONOTONIC in nanoseconds, and a map of each readable pid to its busy
#: nanoseconds, or with threads to {"thread:<tid>": nanoseconds})
Request = tuple[list[int], bool]
Answer = tuple[int, dict[int, int] | dict[int, dict[str, int]]]


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
    out: dict[str, int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        busy = _busy_ns_of(_read_once(f"/proc/{pid}/task/{tid}/stat"), ns_per_tick)
        if busy is not None:
            out[f"thread:{tid}"] = busy
    return out


class BusyTimes:
    """Answers requests (see :data:`Request`), keeping up to ``keep`` stat files open."""

    def __init__(self, keep: int) -> None:
        self.files = _StatFiles(keep)
        weakref.finalize(self, self.files.close)

    def __call__(self, request: Request) -> Answer:
        # the time of the read itself, not of the request: a child answering late on a busy
        # host must not stretch one sample and shrink the next
        pids, threads = request
        ns_per_tick = 1e9 / os.sysconf("SC_CLK_TCK")
        at_ns = time.monotonic_ns()
        if threads:
            return at_ns, {pid: engines for pid in pids if (engines := _threads_busy_ns(pid, ns_per_tick))}
        asked = set(pids)
        self.files.keep_only(asked)
        busy_ns: dict[int, int] = {}
        for pid in asked:
            busy = _busy_ns_of(self.files.read(pid), ns_per_tick)
            if busy is not None:
                busy_ns[pid] = busy
        return at_ns, busy_ns

    def close(self) -> None:
        self.files.close()
