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
from typing import overload

#: a request: (the pids, whether each thread is its own engine); the answer is (when the reads
#: began, by CLOCK_MONOTONIC in nanoseconds, and a map of each readable pid to its busy
#: nanoseconds, or with threads to {"thread:<tid>": nanoseconds})
Request = tuple[list[int], bool]
Answer = tuple[int, dict[int, int] | dict[int, dict[str, int]]]
#: a request that names the answer the caller holds (its number, -1 for none); the answer
#: then gives its own number, the one it is told against (-1: it is whole) and, told
#: against one, only the pids whose busy times changed, and those it no longer has
ToldRequest = tuple[list[int], bool, int]
ToldAnswer = tuple[int, dict[int, int] | dict[int, dict[str, int]], int, int, list[int]]


def _busy_ns_of(data: bytes | None, ns_per_tick: float) -> int | None:
    """utime + stime (fields 14 and 15) of a ``stat`` line, or None when there is none or
    it is a zombie's."""
    if not data:
        return None
    fields = data[data.rfind(b")") + 2 :].split(None, 13)  # the name in parentheses may hold spaces
    if len(fields) < 13 or fields[0] == b"Z":
        return None
    return round((int(fields[11]) + int(fields[12])) * ns_per_tick)


def _busy_and_resting(data: bytes | None, ns_per_tick: float) -> tuple[int | None, bool]:
    """(what :func:`_busy_ns_of` reads, whether the process has one thread and is not
    running or waiting to run): one whose ``schedstat`` does not move after this has not run."""
    busy = _busy_ns_of(data, ns_per_tick)
    if busy is None or data is None:
        return None, False
    fields = data[data.rfind(b")") + 2 :].split(None, 18)
    return busy, len(fields) > 17 and fields[0] != b"R" and fields[17] == b"1"


def _ran_ever(schedstat: bytes) -> bool:
    """Whether a ``schedstat`` line counts the times its thread was put on a CPU (a kernel
    without scheduler statistics writes zeros, which never move)."""
    fields = schedstat.split()
    return len(fields) == 3 and fields[2] != b"0"


class _StatFiles:
    """``/proc/PID/stat`` descriptors kept open between reads and read again with one
    ``pread``: the daemon reads every protected process and job on each tick, and the open
    and close cost more than the read.  A kept descriptor names its process, never a later
    one with the same pid: once the process is gone it reads nothing, and is closed.  At
    most ``limit`` are kept (a share of the open-file limit); the rest are opened per read,
    or with ``kept_only`` not read at all.  ``name``: the file under ``/proc/PID``."""

    def __init__(self, limit: int, name: str = "stat", kept_only: bool = False) -> None:
        self.limit = limit
        self.name = name
        self.kept_only = kept_only
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
        path = f"/proc/{pid}/{self.name}"
        if len(self.fds) >= self.limit:
            return None if self.kept_only else _read_once(path)
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
    """Answers requests (see :data:`Request`), keeping up to ``keep`` files open: each
    process's ``stat``, and its ``schedstat`` where there is room.

    A process that had one thread and was not running when its ``stat`` was last read, and
    whose ``schedstat`` (its run time, its time waiting for a CPU, how often it was put on
    one) has not moved since just before that read, has not run since: its CPU time is the
    one read then.  The kernel writes ``schedstat`` in much less time than ``stat``, and most
    processes under rules are idle, so a tick reads the cheap file for most of them."""

    def __init__(self, keep: int) -> None:
        self.files = _StatFiles(keep - keep // 2)
        self.sched = _StatFiles(keep // 2, "schedstat", kept_only=True)
        self.resting: dict[int, tuple[bytes, int]] = {}  # pid → (its schedstat before the stat read, busy ns)
        self._told: tuple[int, dict[int, int] | dict[int, dict[str, int]]] | None = None  # (number, answer)
        self._asked: set[int] = set()  # the pids the last request asked about
        #: while an answer is held (``_told``), the pids read since that were not taken from
        #: ``resting``: the others have not run since, and their times are the ones it holds
        self._read_again: set[int] = set()
        weakref.finalize(self, self.files.close)
        weakref.finalize(self, self.sched.close)

    @overload
    def __call__(self, request: Request) -> Answer: ...

    @overload
    def __call__(self, request: ToldRequest) -> ToldAnswer: ...

    def __call__(self, request: Request | ToldRequest) -> Answer | ToldAnswer:
        """A whole answer; or, asked with the number of the answer the caller holds, what
        changed since (the daemon's side of a thousand idle processes need not take in,
        check and build a thousand unchanged times every tick)."""
        at_ns, busy = self._read(request[0], request[1])
        if len(request) < 3:
            return at_ns, busy
        held = request[2]
        told, number = self._told, (self._told[0] + 1 if self._told is not None else 0)
        self._told = (number, busy)
        again, self._read_again = self._read_again, set()
        if told is None or told[0] != held:
            return at_ns, busy, number, -1, []
        before: dict[int, object] = told[1]  # type: ignore[assignment]
        changed = {pid: b for pid in again if (b := busy.get(pid)) is not None and before.get(pid) != b}
        return at_ns, changed, number, held, [pid for pid in before if pid not in busy]  # type: ignore[return-value]

    def _read(self, pids: list[int], threads: bool) -> Answer:
        # the time of the read itself, not of the request: a child answering late on a busy
        # host must not stretch one sample and shrink the next
        ns_per_tick = 1e9 / os.sysconf("SC_CLK_TCK")
        at_ns = time.monotonic_ns()
        if threads:
            self.resting.clear()  # what rested was read as a process's time, not its threads'
            self._asked = set()
            self._read_again.update(pids)
            return at_ns, {pid: engines for pid in pids if (engines := _threads_busy_ns(pid, ns_per_tick))}
        asked = set(pids)
        files, sched, resting = self.files, self.sched, self.resting
        if asked != self._asked:  # most ticks ask about the very same processes
            files.keep_only(asked)
            sched.keep_only(asked)
            for pid in [p for p in resting if p not in asked]:
                del resting[pid]
            self._asked = asked
        busy_ns: dict[int, int] = {}
        # only what an answer held is compared with needs noting (the daemon's own reads hold none)
        again: set[int] = self._read_again if self._told is not None else set()
        # a thousand idle processes a tick: each costs one read of its kept schedstat, and
        # the loop around that read is kept as short as the read itself
        kept, pread, get_resting = sched.fds, os.pread, resting.get
        for pid in asked:
            fd = kept.get(pid)
            if fd is not None:
                try:
                    moved: bytes | None = pread(fd, 256, 0)  # read before the stat file: what it says holds from here
                except OSError:
                    moved = b""
                if moved:
                    last = get_resting(pid)
                    if last is not None and moved == last[0]:
                        busy_ns[pid] = last[1]
                        continue
                else:
                    del kept[pid]
                    os.close(fd)
                    moved = None  # gone (a new process under its pid is opened afresh on the next read)
            else:
                moved = sched.read(pid)
            again.add(pid)
            busy, rests = _busy_and_resting(files.read(pid), ns_per_tick)
            if busy is None:
                resting.pop(pid, None)
                continue
            busy_ns[pid] = busy
            if rests and moved is not None and _ran_ever(moved):
                resting[pid] = (moved, busy)
            else:
                resting.pop(pid, None)
        return at_ns, busy_ns

    def close(self) -> None:
        self.files.close()
        self.sched.close()
        self.resting.clear()
        self._asked, self._read_again = set(), set()
        self._told = None
