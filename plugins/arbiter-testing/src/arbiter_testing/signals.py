"""A signal for one thread of another process, and its threads to choose from, as the kernel may hand a signal sent to the
process to any of its threads."""

from __future__ import annotations

import ctypes
import errno
import os
import platform

#: the tgkill system call's number on the machines the tests run on
SYS_TGKILL = {"x86_64": 234, "aarch64": 131}.get(platform.machine())


def signal_thread(pid: int, tid: int, signum: int) -> None:
    """Send ``signum`` to thread ``tid`` of process ``pid`` (``tgkill``)."""
    if SYS_TGKILL is None:
        raise OSError(errno.ENOSYS, f"tgkill's number on {platform.machine()} is not known here")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_TGKILL, pid, tid, signum) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"tgkill({pid}, {tid}, {signum}): {os.strerror(err)}")


def other_threads(pid: int) -> list[int]:
    """The threads of process ``pid`` but its main one, oldest first."""
    return sorted(tid for tid in map(int, os.listdir(f"/proc/{pid}/task")) if tid != pid)
