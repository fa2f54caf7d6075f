"""Signals that reach only the process a :class:`ProcessRef` names.

A pid is reused once its process has exited, so every signal first checks that the pid's
current start time is the ref's (psutil's ``create_time``, the value the process table
reports).  This runs on the fast path (a phase turning on pauses jobs within a
millisecond or two), so on Linux it skips psutil (≈90 µs a check) and reads
``/proc/<pid>/stat`` through a descriptor of ``/proc/<pid>`` (≈15 µs), then signals
through that same descriptor (``pidfd_send_signal``): the signal reaches the process
whose start time was checked even if the pid is reused between the two steps.

That descriptor is then kept, for the next signal to the same ref: it names that process
and no other (a signal through it fails once the process has gone, whatever now has the
pid), so the next signal needs no check and one system call instead of six.  Under load
each call waits for the interpreter lock again, and fifty jobs paused at once paid that
three hundred times.
"""

from __future__ import annotations

import errno
import math
import os
import signal
import sys
import time
import weakref

import psutil

from arbiter.plugin import ProcessRef, open_file_share

#: a ref's start time and the process's may differ by rounding, never by this much
START_TIME_TOLERANCE_S = 0.01

#: descriptors kept per signaller, at most (each names one process); an eighth of the
#: open-file limit where that is lower, as the daemon needs the rest
KEPT_MAX = 1024

#: what :meth:`Signaller.deliver` did
SENT, GONE, REUSED = "sent", "gone", "reused"

_LINUX = sys.platform.startswith("linux") and os.path.exists("/proc/self/stat")


class Signaller:
    """Sends signals to refs, start time checked.  One per translator instance."""

    def __init__(self) -> None:
        self._btime: int | None = None
        self._ticks = os.sysconf("SC_CLK_TCK") if _LINUX else 100
        # Cleared the first time the kernel refuses pidfd_send_signal (old kernel, seccomp).
        self._pidfd_signals = _LINUX and hasattr(signal, "pidfd_send_signal")
        self._kept: dict[ProcessRef, int] = {}  # ref → its /proc/<pid> descriptor, start time checked
        self._kept_max = min(KEPT_MAX, open_file_share(8, KEPT_MAX))
        weakref.finalize(self, _close_all, self._kept)

    def close(self) -> None:
        _close_all(self._kept)

    def send(self, ref: ProcessRef, sig: int) -> bool:
        """Signal ``ref`` if it is still the process it names.

        Returns False when the pid is gone or now belongs to another process.  Raises
        PermissionError when the process is there but this account may not signal it,
        and ValueError for a pid that must never be signalled.
        """
        return self.deliver(ref, sig)[0] == SENT

    def deliver(self, ref: ProcessRef, sig: int) -> tuple[str, float | None]:
        """Like :meth:`send`, saying what happened: (SENT, its start time), (GONE, None),
        or (REUSED, the start time of the process that has the pid now)."""
        pid = ref.pid
        if pid <= 0:
            # kill(0) and kill(-1) signal process groups, or every process we may signal.
            raise ValueError(f"pid {pid} is not a process id")
        if pid == os.getpid():
            raise ValueError(f"pid {pid} is the arbiter daemon itself")
        if _LINUX:
            return self._send_linux(ref, sig)
        return self._send_portable(ref, sig)

    def _send_linux(self, ref: ProcessRef, sig: int) -> tuple[str, float | None]:
        kept = self._kept.pop(ref, None)
        if kept is not None:
            try:
                signal.pidfd_send_signal(kept, sig)
                self._kept[ref] = kept
                return SENT, ref.start_time
            except OSError:
                # gone (then the check below tells a reused pid from none), or refused (and
                # the error is raised there)
                os.close(kept)
        try:
            dirfd = os.open(f"/proc/{ref.pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return GONE, None
        except OSError:
            return self._send_portable(ref, sig)
        try:
            start = self._start_time(dirfd)
            if start is None:
                return GONE, None
            if abs(start - ref.start_time) >= START_TIME_TOLERANCE_S:
                return REUSED, start
            if self._pidfd_signals:
                try:
                    signal.pidfd_send_signal(dirfd, sig)
                    if self._keep(ref, dirfd):
                        dirfd = -1
                    return SENT, start
                except ProcessLookupError:
                    return GONE, None
                except OSError as exc:
                    if exc.errno not in (errno.ENOSYS, errno.EINVAL, errno.EBADF, errno.EOPNOTSUPP):
                        raise
                    self._pidfd_signals = False
            try:
                os.kill(ref.pid, sig)
            except ProcessLookupError:
                return GONE, None
            return SENT, start
        finally:
            if dirfd >= 0:
                os.close(dirfd)

    def stopped(self, ref: ProcessRef) -> bool | None:
        """Whether the process ``ref`` names has stopped (its main thread, for one of many
        threads) or exited, read through the descriptor kept when it was last signalled;
        None where none is kept (no check of its start time would be cheap enough to poll),
        or where its state cannot be read.  Like every use of a kept descriptor, not to be
        called beside another call of this signaller: a translator's calls come one at a
        time."""
        dirfd = self._kept.get(ref)
        if dirfd is None:
            return None
        try:
            tail = _stat_tail(dirfd)
        except (FileNotFoundError, ProcessLookupError):
            return True  # /proc/<pid> of a process that has gone is empty
        except OSError:
            return None
        return not tail or tail[:1] in (b"T", b"t", b"Z", b"X")  # nothing read: no process left

    def _keep(self, ref: ProcessRef, dirfd: int) -> bool:
        if self._kept_max <= 0:
            return False
        if len(self._kept) >= self._kept_max:
            os.close(self._kept.pop(next(iter(self._kept))))  # the one signalled longest ago
        self._kept[ref] = dirfd
        return True

    def _start_time(self, dirfd: int) -> float | None:
        try:
            fields = _stat_tail(dirfd).split()
        except OSError:
            return None  # ESRCH: exited after /proc/<pid> was opened
        if len(fields) < 20:
            return None
        # psutil's arithmetic exactly, so refs from the process table compare equal.
        return float(fields[19]) / self._ticks + self._boot_time()

    def _boot_time(self) -> float:
        # /proc/stat's btime is floor(realtime - boottime); reading /proc/stat costs from
        # ~15 µs to milliseconds on hosts with many CPUs and interrupts, so keep it while
        # the clocks say it cannot have changed (a wall clock step changes it).
        approx = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
        cached = self._btime
        if cached is not None and math.floor(approx) == cached and 0.001 < approx - cached < 0.999:
            return float(cached)
        self._btime = _read_btime()
        return float(self._btime)

    @staticmethod
    def _send_portable(ref: ProcessRef, sig: int) -> tuple[str, float | None]:
        try:
            start = psutil.Process(ref.pid).create_time()
        except psutil.NoSuchProcess:
            return GONE, None
        except psutil.AccessDenied:
            raise PermissionError(errno.EPERM, f"cannot read the start time of pid {ref.pid}") from None
        if abs(start - ref.start_time) >= START_TIME_TOLERANCE_S:
            return REUSED, start
        try:
            os.kill(ref.pid, sig)
        except ProcessLookupError:
            return GONE, None
        return SENT, start


def _stat_tail(dirfd: int) -> bytes:
    """``stat`` of the process whose ``/proc/<pid>`` folder ``dirfd`` is, from its state
    (the field after the command name, which may hold spaces and parentheses) on."""
    fd = os.open("stat", os.O_RDONLY | os.O_CLOEXEC, dir_fd=dirfd)
    try:
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    return data[data.rfind(b")") + 2 :]


def _read_btime() -> int:
    fd = os.open("/proc/stat", os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    for line in b"".join(chunks).splitlines():
        if line.startswith(b"btime"):
            return int(line.split()[1])
    return int(psutil.boot_time())


def _close_all(kept: dict[ProcessRef, int]) -> None:
    for fd in kept.values():
        os.close(fd)
    kept.clear()
