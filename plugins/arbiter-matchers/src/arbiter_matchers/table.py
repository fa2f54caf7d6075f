"""The host's process table, as the daemon's account can see it.

On Linux the table is read straight from ``/proc``: psutil reads the same files but spends
about four times as long doing it (≈80 ms against ≈20 ms for 300 processes on a two-core
host), and the table is read on every tick.  Elsewhere psutil reads it.  Both give the
same values, start times included (psutil's formula), so a :class:`ProcessRef` built from
this table passes the translators' start-time check, which asks psutil.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from dataclasses import dataclass, replace

import psutil
from arbiter.plugin import ProcessInfo, open_file_share

try:
    import pwd
except ImportError:  # pragma: no cover - not a POSIX host
    pwd = None  # type: ignore[assignment]

_PSUTIL_ATTRS = ["pid", "ppid", "name", "exe", "cmdline", "uids", "username", "create_time", "status"]

# psutil status names to the one-letter codes ps(1) shows.
_STATE_CODES = {
    psutil.STATUS_RUNNING: "R",
    psutil.STATUS_SLEEPING: "S",
    psutil.STATUS_DISK_SLEEP: "D",
    psutil.STATUS_STOPPED: "T",
    psutil.STATUS_TRACING_STOP: "t",
    psutil.STATUS_ZOMBIE: "Z",
    psutil.STATUS_DEAD: "X",  # first-letter "D" would read as disk sleep
}

_PROC = "/proc"
_READ_SIZE = 65536


def state_code(status: str) -> str:
    """One-letter state for a psutil status name (``"stopped"`` → ``"T"``)."""
    code = _STATE_CODES.get(status)
    if code is not None:
        return code
    return status[:1].upper()


#: a process that looks unchanged has its command line read again on one scan in this many
#: (spread by pid): a program that rewrites its argv in place (setproctitle) changes nothing
#: else the scan sees
CMDLINE_RECHECK_SCANS = 4


@dataclass(frozen=True)
class _Seen:
    """What one scan read of a process, to spare the next scan re-reading what cannot have
    changed: ``status`` (the real uid; the dearest file to read), the ``exe`` link, and
    mostly the command line."""

    start: bytes  # its start time in clock ticks, as ``stat`` gives it
    comm: bytes  # an exec changes it (the kernel sets it to the new program's name)
    owner: int  # owner of /proc/PID: its effective uid, changed by any setuid that matters
    vsize: bytes  # an exec replaces the address space: its size all but surely changes
    cmdline: bytes  # an exec (or setproctitle) changes it
    info: ProcessInfo


class TableMemo:
    """Processes as the last scan read them, keyed by pid.  A process whose start time,
    name, /proc owner and address-space size are as before is the same program under the
    same uid: its uid and executable are taken from the memo, and so is its command line,
    except on one scan in :data:`CMDLINE_RECHECK_SCANS`, when it is read again and must
    match too.  When its state and parent are the same as well, the very same
    :class:`ProcessInfo` is returned (matchers may then reuse their verdict on it).
    Anything else is read afresh.

    Each process's ``stat`` file is kept open between scans (up to a quarter of the
    open-file limit) and read again in place: opening and closing it cost more than
    reading it.  A kept descriptor reads nothing once its process has gone, so a reused
    pid is read through a new one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, _Seen] = {}
        self._scans = 0
        self._stat_fds: dict[str, int] = {}  # /proc entry → its stat file, kept open
        self._limit = open_file_share(4, 4096)
        weakref.finalize(self, _close_all, self._stat_fds)

    def table(self) -> list[ProcessInfo]:
        with self._lock:
            seen, fresh = self._seen, {}
            self._scans += 1
            try:
                table = proc_table(seen, fresh, self._scans, _StatFiles(self._stat_fds, self._limit))
            finally:
                self._seen = fresh  # vanished pids are forgotten: a reused pid is read afresh
                for entry in [e for e in self._stat_fds if e not in fresh]:
                    os.close(self._stat_fds.pop(entry))
            return table


@dataclass
class _StatFiles:
    """The stat files a memo keeps open, and how many it may."""

    fds: dict[str, int]
    limit: int

    def read(self, entry: str) -> tuple[bytes | None, int]:
        """The stat line of /proc/ENTRY and the owner of /proc/ENTRY (-1 when unreadable)."""
        fd = self.fds.get(entry)
        if fd is not None:
            try:
                data = os.pread(fd, _READ_SIZE, 0)
                if data:
                    return data, os.fstat(fd).st_uid
            except OSError:
                pass
            del self.fds[entry]  # its process is gone: the pid, if listed, is another's
            os.close(fd)
        if len(self.fds) >= self.limit:
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
            self.fds[entry] = fd
        else:
            os.close(fd)
        return data, owner


def _close_all(fds: dict[str, int]) -> None:
    for fd in fds.values():
        os.close(fd)
    fds.clear()



def process_table(memo: TableMemo | None = None) -> list[ProcessInfo]:
    """Every process on the host; vanished ones are left out, unreadable fields left empty.
    With ``memo``, what cannot have changed since its last scan is not read again."""
    if sys.platform.startswith("linux") and os.path.exists(f"{_PROC}/self/stat"):
        try:
            return memo.table() if memo is not None else proc_table()
        except OSError:
            pass  # /proc mounted oddly (hidepid, a container without it): psutil copes
    return psutil_table()


def psutil_table() -> list[ProcessInfo]:
    """The table through psutil (any platform psutil supports)."""
    usernames: dict[int, str] = {}
    table: list[ProcessInfo] = []
    # Fresh Process objects, not process_iter(): its cache keeps a Process's first start
    # time, so a pid reused between two scans would show the old process's start time.
    for pid in psutil.pids():
        try:
            info = psutil.Process(pid).as_dict(_PSUTIL_ATTRS, ad_value=None)
        except psutil.Error:
            continue  # gone (or denied even its identity) since the pid list was read
        uids = info.get("uids")
        uid = int(uids.real) if uids is not None else -1
        username = info.get("username") or ""
        if not username and uid >= 0:
            username = _username(uid, usernames)
        table.append(
            ProcessInfo(
                pid=pid,
                ppid=info.get("ppid") or 0,
                name=info.get("name") or "",
                exe=info.get("exe") or "",
                cmdline=tuple(info.get("cmdline") or ()),
                uid=uid,
                username=username,
                start_time=float(info.get("create_time") or 0.0),
                state=state_code(info.get("status") or ""),
            )
        )
    return table


def proc_table(seen: dict[str, _Seen] | None = None, fresh: dict[str, _Seen] | None = None,
               scan: int = 0, stat_files: _StatFiles | None = None) -> list[ProcessInfo]:
    """The table read from ``/proc`` (Linux).  Raises OSError when ``/proc`` is unusable.
    ``seen``: what a previous scan read (see :class:`TableMemo`); ``fresh`` gets this one's;
    ``scan`` counts the memo's scans; ``stat_files``, the stat files it keeps open."""
    boot_time = _boot_time()
    ticks = os.sysconf("SC_CLK_TCK")
    usernames: dict[int, str] = {}
    table: list[ProcessInfo] = []
    for entry in os.listdir(_PROC):
        if not entry.isdigit():
            continue
        info = _read_proc(entry, boot_time, ticks, usernames, seen, fresh, scan, stat_files)
        if info is not None:
            table.append(info)
    table.sort(key=lambda p: p.pid)
    return table


def _read_proc(entry: str, boot_time: float, ticks: int, usernames: dict[int, str],
               seen: dict[str, _Seen] | None = None, fresh: dict[str, _Seen] | None = None,
               scan: int = 0, stat_files: _StatFiles | None = None) -> ProcessInfo | None:
    base = f"{_PROC}/{entry}"
    stat, owner = stat_files.read(entry) if stat_files is not None else _read_owned(f"{base}/stat")
    if not stat:
        return None  # exited since the directory was listed
    # The name sits between the first "(" and the last ")" and may itself hold either.
    lpar = stat.find(b"(")
    rpar = stat.rfind(b")")
    fields = stat[rpar + 2 :].split(None, 21)  # fields up to vsize (the 23rd) are used
    if lpar < 0 or rpar < 0 or len(fields) < 21:
        return None
    if seen is None or fresh is None:
        return _parse_proc(base, stat, lpar, rpar, fields, _read(f"{base}/cmdline") or b"", boot_time, ticks, usernames)
    comm, vsize = stat[lpar + 1 : rpar], fields[20]
    before = seen.get(entry)
    if before is not None and (before.start, before.comm, before.owner, before.vsize) == (fields[19], comm, owner, vsize):
        recheck = (scan + int(entry)) % CMDLINE_RECHECK_SCANS == 0
        raw_cmdline = (_read(f"{base}/cmdline") or b"") if recheck else before.cmdline
        if raw_cmdline == before.cmdline:
            info = before.info
            state, ppid = fields[0].decode(errors="replace"), int(fields[1])
            if info.state != state or info.ppid != ppid:
                info = replace(info, state=state, ppid=ppid)
            fresh[entry] = replace(before, info=info) if info is not before.info else before
            return info
    else:
        raw_cmdline = _read(f"{base}/cmdline") or b""
    info = _parse_proc(base, stat, lpar, rpar, fields, raw_cmdline, boot_time, ticks, usernames)
    if info is not None:
        fresh[entry] = _Seen(fields[19], comm, owner, vsize, raw_cmdline, info)
    return info


def _parse_proc(base: str, stat: bytes, lpar: int, rpar: int, fields: list[bytes], raw_cmdline: bytes, boot_time: float,
                ticks: int, usernames: dict[int, str]) -> ProcessInfo | None:
    name = os.fsdecode(stat[lpar + 1 : rpar])
    try:
        state = fields[0].decode()
        ppid = int(fields[1])
        start_time = float(fields[19]) / ticks + boot_time
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
    return ProcessInfo(
        pid=int(base.rsplit("/", 1)[1]),
        ppid=ppid,
        name=name,
        exe=exe,
        cmdline=cmdline,
        uid=uid,
        username=username,
        start_time=start_time,
        state=state,
    )


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
    if data:
        for line in data.splitlines():
            if line.startswith(b"btime"):
                return float(line.split()[1])
    return float(psutil.boot_time())


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
