"""Reading ``/proc`` into process records, in the daemon or in a child process of its own.

This module uses the standard library only, so that a child worker
(:class:`arbiter.plugin.ChildWorker`) can run it without importing anything else: a scan of
a thousand processes holds the interpreter for about 20 ms, and in the daemon's own
interpreter that is 20 ms during which its fast path (a phase turning on, jobs paused
within a millisecond or two) waits for the lock.  With a child the daemon only waits on a
pipe, and receives what changed.

A record holds :class:`arbiter.plugin.ProcessInfo`'s fields, in its order.  A scan returns
the pids it found, in order, and the records that are new or changed since the scan
before: a caller that keeps the previous records has the whole table.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass

try:
    import pwd
except ImportError:  # pragma: no cover - not a POSIX host
    pwd = None  # type: ignore[assignment]

#: (pid, ppid, name, exe, cmdline, uid, username, start_time, state, cpu_ns)
Record = tuple[int, int, str, str, tuple[str, ...], int, str, float, str, int]
RECORD_TYPES = (int, int, str, str, tuple, int, str, float, str, int)

#: a process that looks unchanged has its command line read again on one scan in this many
#: (spread by pid): a program that rewrites its argv in place (setproctitle) changes nothing
#: else the scan sees
CMDLINE_RECHECK_SCANS = 4

_PROC = "/proc"
_READ_SIZE = 65536


@dataclass(frozen=True)
class _Seen:
    """What one scan read of a process, to spare the next scan re-reading what cannot have
    changed: ``status`` (the real uid; the dearest file to read), the ``exe`` link, and
    mostly the command line."""

    stat: bytes  # the whole line: an idle process's is the same from one scan to the next
    start: bytes  # its start time in clock ticks, as ``stat`` gives it
    comm: bytes  # an exec changes it (the kernel sets it to the new program's name)
    owner: int  # owner of /proc/PID: its effective uid, changed by any setuid that matters
    vsize: bytes  # an exec replaces the address space: its size all but surely changes
    cmdline: bytes  # an exec (or setproctitle) changes it
    record: Record


class ProcScan:
    """Scans of ``/proc``, each compared with the one before.  A process whose start time,
    name, /proc owner and address-space size are as before is the same program under the
    same uid: its uid and executable are taken from the last scan, and so is its command
    line, except on one scan in :data:`CMDLINE_RECHECK_SCANS`, when it is read again and
    must match too.  When its state, parent and CPU time are the same as well, it is not among
    the changed records.  Anything else is read afresh.

    Each process's ``stat`` file is kept open between scans (up to ``keep``) and read
    again in place: opening and closing it cost more than reading it.  A kept descriptor
    reads nothing once its process has gone, so a reused pid is read through a new one.
    Its ``cmdline`` file is kept too, while its ``stat`` file is and ``keep`` (the two
    together) leaves room, and closed with it.  Not thread-safe: one caller at a time."""

    def __init__(self, keep: int) -> None:
        self._seen: dict[str, _Seen] = {}
        self._scans = 0
        self._stat_fds: dict[str, int] = {}  # /proc entry → its stat file, kept open
        self._cmdline_fds: dict[str, int] = {}  # /proc entry → its cmdline file, kept with its stat file
        self._limit = keep
        weakref.finalize(self, _close_all, self._stat_fds)
        weakref.finalize(self, _close_all, self._cmdline_fds)

    def scan(self) -> tuple[list[int], list[Record]]:
        """(every pid found, ascending; the records new or changed since the last scan).
        Raises OSError when ``/proc`` is unusable."""
        seen, fresh = self._seen, {}
        self._scans += 1
        try:
            boot_time = _boot_time()
            ticks = os.sysconf("SC_CLK_TCK")
            usernames: dict[int, str] = {}
            changed: list[Record] = []
            for entry in os.listdir(_PROC):
                if not entry.isdigit():
                    continue
                before = seen.get(entry)
                now = self._read(entry, before, boot_time, ticks, usernames)
                if now is None:
                    continue
                fresh[entry] = now
                if before is None or now.record is not before.record:
                    changed.append(now.record)
        finally:
            self._seen = fresh  # vanished pids are forgotten: a reused pid is read afresh
            for fds in (self._stat_fds, self._cmdline_fds):
                for entry in [e for e in fds if e not in fresh]:
                    os.close(fds.pop(entry))
        return sorted(int(entry) for entry in fresh), changed

    def read(self, pids: list[int]) -> tuple[list[int], list[Record]]:
        """Only these processes, read afresh: (those of them that exist, ascending; their
        records).  What the kernel's process events name is read so, whole: an exec that
        keeps the program's name and address-space size looks unchanged to a scan until its
        command line is next rechecked.  Every other process is as the last read left it.
        Raises OSError when ``/proc`` is unusable."""
        seen = self._seen
        self._scans += 1
        boot_time = _boot_time()
        ticks = os.sysconf("SC_CLK_TCK")
        usernames: dict[int, str] = {}
        found: list[int] = []
        changed: list[Record] = []
        for pid in sorted(set(pids)):
            entry = str(pid)
            seen.pop(entry, None)
            now = self._read(entry, None, boot_time, ticks, usernames)
            if now is None:
                for fds in (self._stat_fds, self._cmdline_fds):
                    if entry in fds:
                        os.close(fds.pop(entry))
                continue
            seen[entry] = now
            found.append(pid)
            changed.append(now.record)
        return found, changed

    def forget(self, pids: list[int]) -> None:
        """Read these processes afresh on the next scan: another reader has read them since
        (an exec that keeps the program's name and address-space size would look unchanged,
        and bring back the old command line)."""
        for pid in pids:
            self._seen.pop(str(pid), None)

    def __call__(self, request: list[int] | dict[str, list[int]] | None = None) -> tuple[list[int], list[Record]]:
        """A child worker's request: one scan (``None``; ``{"forget": pids}``: one reading
        those afresh, see :meth:`forget`), or a read of the pids it names (a list)."""
        if isinstance(request, dict):
            self.forget(request.get("forget", []))
            return self.scan()
        return self.scan() if request is None else self.read(request)

    def close(self) -> None:
        _close_all(self._stat_fds)
        _close_all(self._cmdline_fds)
        self._seen = {}

    def _read(
        self, entry: str, before: _Seen | None, boot_time: float, ticks: int, usernames: dict[int, str]
    ) -> _Seen | None:
        base = f"{_PROC}/{entry}"
        stat, owner = self._read_stat(entry)
        if not stat:
            return None  # exited since the directory was listed
        if (
            before is not None
            and stat == before.stat
            and owner == before.owner
            and (self._scans + before.record[0]) % CMDLINE_RECHECK_SCANS
        ):
            return before  # nothing this scan reads has changed, and its command line is not due
        # The name sits between the first "(" and the last ")" and may itself hold either.
        lpar = stat.find(b"(")
        rpar = stat.rfind(b")")
        fields = stat[rpar + 2 :].split(None, 21)  # fields up to vsize (the 23rd) are used
        if lpar < 0 or rpar < 0 or len(fields) < 21:
            return None
        comm, vsize = stat[lpar + 1 : rpar], fields[20]
        if before is not None and (before.start, before.comm, before.owner, before.vsize) == (
            fields[19],
            comm,
            owner,
            vsize,
        ):
            recheck = (self._scans + int(entry)) % CMDLINE_RECHECK_SCANS == 0
            raw_cmdline = self._read_cmdline(entry) if recheck else before.cmdline
            if raw_cmdline == before.cmdline:
                try:
                    state, ppid, cpu_ns = fields[0].decode(), int(fields[1]), _cpu_ns(fields, ticks)
                except (ValueError, UnicodeDecodeError):
                    return None
                record = before.record
                if record[8] != state or record[1] != ppid or record[9] != cpu_ns:
                    record = (record[0], ppid, *record[2:8], state, cpu_ns)
                elif stat == before.stat:
                    return before
                return _Seen(stat, before.start, comm, owner, vsize, raw_cmdline, record)
        else:
            raw_cmdline = self._read_cmdline(entry)
        parsed = _parse(base, stat, lpar, rpar, fields, raw_cmdline, boot_time, ticks, usernames)
        return None if parsed is None else _Seen(stat, fields[19], comm, owner, vsize, raw_cmdline, parsed)

    def _read_stat(self, entry: str) -> tuple[bytes | None, int]:
        """The stat line of /proc/ENTRY and the owner of /proc/ENTRY (-1 when unreadable)."""
        fds = self._stat_fds
        fd = fds.get(entry)
        if fd is not None:
            try:
                data = os.pread(fd, _READ_SIZE, 0)
                if data:
                    return data, os.fstat(fd).st_uid
            except OSError:
                pass
            del fds[entry]  # its process is gone: the pid, if listed, is another's
            os.close(fd)
            if entry in self._cmdline_fds:
                os.close(self._cmdline_fds.pop(entry))
        if len(fds) + len(self._cmdline_fds) >= self._limit:
            return _read_owned(f"{_PROC}/{entry}/stat")
        try:
            fd = os.open(f"{_PROC}/{entry}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None, -1
        try:
            data, owner = os.read(fd, _READ_SIZE), os.fstat(fd).st_uid
        except OSError:
            os.close(fd)
            return None, -1
        if data:
            fds[entry] = fd
        else:
            os.close(fd)
        return data, owner

    def _read_cmdline(self, entry: str) -> bytes:
        """The command line of /proc/ENTRY, read through a kept descriptor where its stat
        file is kept (which vouches that the process is the one it was opened for)."""
        fds = self._cmdline_fds
        fd = fds.get(entry)
        if fd is None:
            path = f"{_PROC}/{entry}/cmdline"
            if entry not in self._stat_fds or len(self._stat_fds) + len(fds) >= self._limit:
                return _read(path) or b""
            try:
                fd = fds[entry] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return b""
        try:
            return _pread_all(fd)
        except OSError:
            os.close(fds.pop(entry))
            return b""


def _close_all(fds: dict[str, int]) -> None:
    for fd in fds.values():
        os.close(fd)
    fds.clear()


def _parse(
    base: str,
    stat: bytes,
    lpar: int,
    rpar: int,
    fields: list[bytes],
    raw_cmdline: bytes,
    boot_time: float,
    ticks: int,
    usernames: dict[int, str],
) -> Record | None:
    name = os.fsdecode(stat[lpar + 1 : rpar])
    try:
        state = fields[0].decode()
        ppid = int(fields[1])
        start_time = float(fields[19]) / ticks + boot_time
        cpu_ns = _cpu_ns(fields, ticks)
    except (ValueError, UnicodeDecodeError):
        return None  # not the format this reader knows: leave the process out, not the table

    cmdline = _split_cmdline(raw_cmdline)

    if len(name) >= 15 and cmdline:
        # The kernel keeps 15 characters of the name; argv[0] usually holds the rest.
        full = os.path.basename(cmdline[0])
        if full.startswith(name):
            name = full

    try:
        exe = os.readlink(f"{base}/exe")
    except OSError:
        exe = ""  # another user's process without ptrace rights, or a kernel thread
    if exe.endswith(" (deleted)") and not os.path.exists(exe):
        exe = exe[: -len(" (deleted)")]

    uid = _real_uid(f"{base}/status")
    username = _username(uid, usernames) if uid >= 0 else ""
    return (int(base.rsplit("/", 1)[1]), ppid, name, exe, cmdline, uid, username, start_time, state, cpu_ns)


def _cpu_ns(fields: list[bytes], ticks: int) -> int:
    """utime + stime (the stat line's 14th and 15th fields) in nanoseconds."""
    return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // ticks


def _split_cmdline(data: bytes) -> tuple[str, ...]:
    # psutil's rules, so both tables agree: programs that rewrite their argv (setproctitle)
    # leave one space-separated string instead of NUL-separated arguments.
    if not data:
        return ()
    sep = b"\0" if data.endswith(b"\0") else b" "
    if data.endswith(sep):
        data = data[:-1]
    parts = data.split(sep)
    if sep == b"\0" and len(parts) == 1 and b" " in data:
        parts = data.split(b" ")
    return tuple(os.fsdecode(p) for p in parts)


def _read(path: str) -> bytes | None:
    # os.open/os.read skip the buffered file object, and one large read takes a whole
    # /proc file in one call: this runs three times per process on every tick.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, _READ_SIZE)
        if len(data) < _READ_SIZE:
            return data
        chunks = [data]
        while chunk := os.read(fd, _READ_SIZE):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _pread_all(fd: int) -> bytes:
    data = os.pread(fd, _READ_SIZE, 0)
    if len(data) < _READ_SIZE:
        return data
    chunks = [data]
    while chunk := os.pread(fd, _READ_SIZE, sum(map(len, chunks))):
        chunks.append(chunk)
    return b"".join(chunks)


def _read_owned(path: str) -> tuple[bytes | None, int]:
    """A /proc/PID file and its owner (-1 when unreadable).  Every file under /proc/PID has
    the owner of /proc/PID itself (the process's effective uid, root when it is not
    dumpable), and asking the open file spares walking the path a second time."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None, -1
    try:
        owner = os.fstat(fd).st_uid
        data = os.read(fd, _READ_SIZE)
        if len(data) < _READ_SIZE:
            return data, owner
        chunks = [data]
        while chunk := os.read(fd, _READ_SIZE):
            chunks.append(chunk)
        return b"".join(chunks), owner
    except OSError:
        return None, -1
    finally:
        os.close(fd)


def _real_uid(status_path: str) -> int:
    data = _read(status_path)
    if not data:
        return -1
    at = data.find(b"\nUid:")
    if at < 0:
        return -1
    try:
        return int(data[at + 5 :].split(None, 1)[0])
    except (ValueError, IndexError):
        return -1


def _boot_time() -> float:
    # The same source and arithmetic as psutil.Process.create_time(), so start times agree
    # to the bit with what the signal translator checks.
    data = _read(f"{_PROC}/stat")
    for line in (data or b"").splitlines():
        if line.startswith(b"btime"):
            return float(line.split()[1])
    raise OSError(f"{_PROC}/stat gives no boot time (btime)")


def _username(uid: int, cache: dict[int, str]) -> str:
    name = cache.get(uid)
    if name is None:
        name = str(uid)
        if pwd is not None:
            try:
                name = pwd.getpwuid(uid).pw_name
            except KeyError:
                pass  # no passwd entry (a container's uid): the number is the name
        cache[uid] = name
    return name
