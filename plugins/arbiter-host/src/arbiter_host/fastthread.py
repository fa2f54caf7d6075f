"""A short scheduler slice for the daemon's fast-path threads (the ``arbiter_fast_thread`` hook).

A phase change must reach a paused job in a millisecond or two.  On a busy machine the
thread that carries it spent most of that time runnable but waiting for a core: measured
under bench/load.py, the wait before the first signal of a phase change reached 5 ms at p99,
and 11 ms during them.  Linux 6.12 and later (the EEVDF scheduler) let any thread ask for a shorter
slice: a thread that asks for a short one is picked sooner when it wakes and may preempt a
thread running a longer one, while its share of the CPU over time stays what it was.  It
needs no privilege, and it is the kernel's documented way for a latency-sensitive task to
say so (``sched_setattr(2)``, ``sched_runtime`` of a ``SCHED_OTHER`` or ``SCHED_BATCH``
thread).

Only the slice changes: the thread's policy and nice value are read first and written back
as they were.  A kernel before 6.12 keeps no slice per thread; there, and on other OSes,
nothing is done and the hook says so.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
import sys
from dataclasses import dataclass

#: the slice asked for: the shortest the kernel grants is 0.1 ms
SLICE_NS = 100_000

#: struct sched_attr as the first kernel that had it laid it out (48 bytes): size, policy,
#: flags, nice, priority, runtime, deadline, period
_ATTR = struct.Struct("=IIQiIQQQ")
_FAIR_POLICIES = {0: "SCHED_OTHER", 3: "SCHED_BATCH"}
_RESET_ON_FORK = 0x01
#: (sched_setattr, sched_getattr) by machine, where libc has no wrapper (glibc before 2.41)
_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275), "riscv64": (274, 275), "loongarch64": (274, 275)}


@dataclass(frozen=True)
class SchedAttr:
    policy: int
    flags: int
    nice: int
    priority: int
    runtime_ns: int


class SchedCalls:
    """``sched_getattr``/``sched_setattr`` of the calling thread, through libc's wrappers
    or the raw system calls."""

    def __init__(self) -> None:
        # the interpreter's own symbols, libc's among them (find_library would run ldconfig)
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.wrapped = hasattr(self.libc, "sched_getattr") and hasattr(self.libc, "sched_setattr")
        self.numbers = _SYSCALLS.get(platform.machine())

    @property
    def available(self) -> bool:
        return self.wrapped or self.numbers is not None

    def get(self) -> SchedAttr:
        buf = ctypes.create_string_buffer(_ATTR.size)
        if self.wrapped:
            result = self.libc.sched_getattr(0, buf, _ATTR.size, 0)
        else:
            assert self.numbers is not None
            result = self.libc.syscall(self.numbers[1], 0, buf, _ATTR.size, 0)
        _check(result, "sched_getattr")
        _, policy, flags, nice, priority, runtime, _, _ = _ATTR.unpack(buf.raw)
        return SchedAttr(policy, flags, nice, priority, runtime)

    def set(self, attr: SchedAttr) -> None:
        buf = ctypes.create_string_buffer(
            _ATTR.pack(_ATTR.size, attr.policy, attr.flags, attr.nice, attr.priority, attr.runtime_ns, 0, 0)
        )
        if self.wrapped:
            result = self.libc.sched_setattr(0, buf, 0)
        else:
            assert self.numbers is not None
            result = self.libc.syscall(self.numbers[0], 0, buf, 0)
        _check(result, "sched_setattr")


def _check(result: int, call: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{call}: {os.strerror(errno)}")


def ask_short_slice() -> str | None:
    """Ask for :data:`SLICE_NS` on the calling thread: what was done, or why nothing was;
    None off Linux.  Raises nothing."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        calls = SchedCalls()
    except OSError as exc:
        return f"no scheduler hint: libc cannot be loaded ({exc})"
    if not calls.available:
        return (
            f"no scheduler hint: this libc has no sched_setattr, and its system call number on "
            f"{platform.machine()} is not known here"
        )
    try:
        before = calls.get()
        if before.policy not in _FAIR_POLICIES:
            return f"no scheduler hint: the thread runs under policy {before.policy}, not a fair one"
        calls.set(SchedAttr(before.policy, before.flags & _RESET_ON_FORK, before.nice, 0, SLICE_NS))
        after = calls.get()
    except OSError as exc:
        return f"no scheduler hint: {exc.strerror or exc}"
    if after.runtime_ns != SLICE_NS:
        return f"no scheduler hint: kernel {platform.release()} keeps no slice per thread (Linux 6.12 and later do)"
    was = f" (was {before.runtime_ns / 1e6:g} ms)" if before.runtime_ns else ""
    return f"{_FAIR_POLICIES[after.policy]} slice {SLICE_NS / 1e6:g} ms{was}, nice {after.nice}"
