"""The host's process table, as the daemon's account can see it.

On Linux the table is read straight from ``/proc``: psutil reads the same files but spends
about four times as long doing it (≈80 ms against ≈20 ms for 300 processes on a two-core
host), and the table is read on every tick.  Elsewhere psutil reads it.  Both give the
same values, start times included (psutil's formula), so a :class:`ProcessRef` built from
this table passes the translators' start-time check, which asks psutil.

The daemon's table is read by a child worker (:class:`TableMemo` with ``in_child``): the
scan is about 20 ms of Python a tick, and in the daemon's interpreter its fast path would
wait for it.  The child sends what changed; the daemon builds only that.  The few processes
the kernel's process events name between two scans are read in the daemon itself: a round
trip to the child for them cost more (two wake-ups a read, the answer checked and copied)
than reading their files.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time

import psutil

from arbiter.plugin import EXITED, ChildWorker, ChildWorkFailed, ProcessInfo, open_file_share
from arbiter_matchers import _procscan
from arbiter_matchers._procevents import ProcEvents
from arbiter_matchers._procscan import RECORD_TYPES, ProcScan, Record, _username

_PSUTIL_ATTRS = ["pid", "ppid", "name", "exe", "cmdline", "uids", "username", "create_time", "status"]

# psutil status names to the one-letter codes ps(1) shows.
_STATE_CODES = {
    psutil.STATUS_RUNNING: "R",
    psutil.STATUS_SLEEPING: "S",
    psutil.STATUS_DISK_SLEEP: "D",
    psutil.STATUS_STOPPED: "T",
    psutil.STATUS_TRACING_STOP: "t",
    psutil.STATUS_ZOMBIE: EXITED,
    psutil.STATUS_DEAD: "X",  # first-letter "D" would read as disk sleep
}

_PROC = "/proc"
_LOADAVG = "/proc/loadavg"


def state_code(status: str) -> str:
    """One-letter state for a psutil status name (``"stopped"`` → ``"T"``)."""
    code = _STATE_CODES.get(status)
    if code is not None:
        return code
    return status[:1].upper()


#: how long the daemon waits for its scanner child's answer before it kills the child and
#: reads the table itself (a scan of a thousand processes takes about 20 ms)
CHILD_TIMEOUT_S = 3.0

#: after a scanner child failed, the table is read in this process for this long before
#: another child is started
CHILD_RETRY_S = 60.0

#: with the kernel's process events, the table is read when they announce a change, and at
#: least this often whatever they say: what no event carries (a program rewriting its command
#: line in place) is seen then, and a scan that finds a process no event announced stops
#: trusting them
FULL_SCAN_S = 10.0


class TableMemo:
    """The table between scans: a process that did not change is the very same
    :class:`ProcessInfo`, and one that only ran (its CPU time alone changed) an equal one
    (matchers may reuse their verdict on either), and what cannot have changed is not read
    again (see :class:`~arbiter_matchers._procscan.ProcScan`).

    With ``in_child``, the scans run in a child worker and this process only builds what
    changed.  A child that exits, hangs, raises or answers what no scan gives is killed
    (``child_failure`` says why); the table is then read here, and another child is tried
    after :data:`CHILD_RETRY_S`.

    With ``events``, the kernel's process events (:mod:`~arbiter_matchers._procevents`) say
    whether anything can have changed: while nothing did, the table is the last one, unread,
    for up to :data:`FULL_SCAN_S`.  Its CPU times are not read then, so it gives none
    (``cpu_ns`` is None, and a reader reads them itself for the processes it is asked about).
    Where the events cannot be had, fail, or miss a process, the table is read on every call
    (``events_why`` says why).  What the events name is read in this process, not asked of
    the child, whose next scan reads those processes afresh (``forget``)."""

    def __init__(self, *, in_child: bool = False, events: bool = False) -> None:
        self._lock = threading.Lock()
        self._keep = open_file_share(4, 4096)
        self._scan = ProcScan(self._keep)
        self._child = (
            ChildWorker(_procscan.__file__, "ProcScan", self._keep, timeout_s=CHILD_TIMEOUT_S, retry_s=CHILD_RETRY_S)
            if in_child
            else None
        )
        self._from_child = False  # whether the last table came from the child's scan
        self._reader = ProcScan(0)  # reads what the events name while the child scans
        self._read_here: set[int] = set()  # pids read so since the child's last scan
        self._infos: dict[int, ProcessInfo] = {}
        self._events: ProcEvents | None = None
        self.events_why = "" if events else "not asked for"
        if events:
            try:
                self._events = ProcEvents()
            except OSError as exc:
                self.events_why = f"the kernel's process events cannot be had: {exc.strerror or exc}"
        self._scanned_at = -FULL_SCAN_S  # monotonic time of the last scan
        self._quiet: dict[int, ProcessInfo] | None = None  # the table without CPU times, by pid
        self._count = -1  # the machine's process count when it was last read
        self._newest = -1  # the newest pid the kernel had handed out then

    @property
    def events_in_use(self) -> bool:
        """Whether the kernel's process events spare scans now."""
        return self._events is not None and not self._events.broken

    def about(self) -> str:
        """How the table is read now, in one line."""
        if self._child is not None and self._from_child:
            where = "in a child process"
        else:
            failed = self.child_failure
            where = f"in the daemon (its child was given up: {failed})" if failed else "in the daemon"
        if self.events_in_use:
            return f"the kernel's process events name what to read again, {where}; a full scan every {FULL_SCAN_S:g}s"
        return f"a full scan on every read, {where}: {self.events_why}"

    @property
    def child_pid(self) -> int | None:
        """The scanner child's pid, while there is one."""
        return None if self._child is None else self._child.pid

    @property
    def child_failure(self) -> str:
        """Why the last scanner child was given up ("" when none was)."""
        return "" if self._child is None else self._child.failure

    def table(self) -> list[ProcessInfo]:
        with self._lock:
            events = self._events
            if events is None or events.broken:
                return self._scan_table()
            if self._quiet is None or time.monotonic() - self._scanned_at >= FULL_SCAN_S:
                return self._full(events, verify=self._quiet is not None)
            count, newest = _process_count(), _newest_pid()  # read before the events they must match
            touched = events.changes()
            if touched is None:
                return self._full(events, verify=False)  # events lost, or the source failed
            if not events.heard and newest != self._newest:
                # A pid handed out with no fork heard: the source has gone deaf (a birth and a
                # death between two calls leave the count alone, so the count cannot tell).
                return self._full(events, verify=True)
            if not touched and count != self._count:
                return self._full(events, verify=False)  # a death no event told (a zombie reaped)
            self._count, self._newest = count, newest
            if touched:
                self._read_some(touched)
            quiet = self._quiet
            if quiet is None:  # reading those it named failed: read them all now
                return self._full(events, verify=False)
            return list(quiet.values())

    def _full(self, events: ProcEvents, *, verify: bool) -> list[ProcessInfo]:
        """Every process read; with ``verify``, one the events should have kept up to date
        that differs in who is there stops trusting them."""
        before = self._infos
        self._count, self._newest = _process_count(), _newest_pid()
        early = events.changes()  # what the scan reads needs no event; told, it is no miss
        table = self._scan_table()
        late = events.changes()
        if late is not None and early is not None and verify:
            told = early | late
            missed = [p for p in self._infos if p not in before and p not in told]
            # a zombie reaped is the one departure no event announces
            missed += [
                p for p, info in before.items() if p not in self._infos and p not in told and info.state != EXITED
            ]
            if missed:
                events.fail(f"a scan found processes {sorted(missed)[:5]} born or gone that no event announced")
        if events.broken:
            self.events_why = f"the kernel's process events failed: {events.broken}"
            return table
        self._scanned_at = time.monotonic()
        self._quiet = self._stripped(self._quiet or {})
        if late is None:
            self._quiet = None  # lost while it read: read all again next time
        elif told := late | (early or set()):
            self._read_some(told)  # the scan trusts what looks unchanged: these it reads afresh
        return table if self._quiet is None else list(self._quiet.values())

    def _read_some(self, pids: set[int]) -> None:
        """Read again the processes the events name, and the children of any that exited
        (the kernel gives them another parent)."""
        pids = pids | {pid for pid, info in self._infos.items() if info.ppid in pids}
        asked = sorted(pids)
        try:
            if self._child is not None and self._from_child:
                self._read_here.update(asked)  # the child's next scan must not trust its older read
                found, changed = self._reader.read(asked)
            else:
                found, changed = self._scan.read(asked)
        except (ChildWorkFailed, _NotAScan, OSError):
            self._quiet = None  # read them all on the next call
            return
        made = {record[0]: ProcessInfo(*record) for record in changed}
        infos, quiet = self._infos, self._quiet
        assert quiet is not None
        present = set(found)
        last = next(reversed(infos), -1)  # the highest pid before: a process born above it goes last
        born = False
        for pid in asked:
            if pid not in present:
                infos.pop(pid, None)
                quiet.pop(pid, None)
            elif pid in made:
                info = made[pid]
                born = born or (pid < last and pid not in infos)
                infos[pid] = info
                kept = quiet.get(pid)
                quiet[pid] = kept if kept is not None and kept == info else dataclasses.replace(info, cpu_ns=None)
        if born:  # in pid order, as a scan gives them (a pid handed out again below the highest)
            self._infos = dict(sorted(infos.items()))
            self._quiet = dict(sorted(quiet.items()))

    def _stripped(self, last: dict[int, ProcessInfo]) -> dict[int, ProcessInfo]:
        """The table without CPU times, a process's record kept where it did not change."""
        out = {}
        for pid, info in self._infos.items():
            kept = last.get(pid)
            out[pid] = kept if kept is not None and kept == info else dataclasses.replace(info, cpu_ns=None)
        return out

    def _scan_table(self) -> list[ProcessInfo]:
        if self._child is not None:
            forget, self._read_here = sorted(self._read_here), set()
            self._reader.close()  # what it read is the child's to read from now on
            try:
                table = self._apply(*_scan_answer(self._child.call({"forget": forget} if forget else None)))
                self._from_child = True
                return table
            except ChildWorkFailed:
                pass  # read here; the worker keeps why, and starts a new child later
            except _NotAScan as exc:
                self._child.give_up(str(exc))
        if self._from_child:
            # its own last scan is older than the child's: start it afresh
            self._scan.close()
            self._scan = ProcScan(self._keep)
            self._from_child = False
        return self._apply(*self._scan.scan())

    def close(self) -> None:
        """End the scanner child, if one runs, and close what the scans keep open."""
        with self._lock:
            if self._events is not None:
                self._events.close()
            if self._child is not None:
                self._child.close()
            self._scan.close()
            self._reader.close()

    def _apply(self, pids: list[int], changed: list[Record]) -> list[ProcessInfo]:
        made = {record[0]: ProcessInfo(*record) for record in changed}
        old = self._infos
        try:
            infos = {pid: made[pid] if pid in made else old[pid] for pid in pids}
        except KeyError as exc:
            raise _NotAScan(f"it left out pid {exc}, which is new since the last scan") from None
        self._infos = infos
        return list(infos.values())


def _process_count() -> int:
    """How many processes the machine has: the kernel gives ``/proc`` a link for each (and a
    few of its own); -1 where that cannot be read."""
    try:
        return os.stat(_PROC).st_nlink
    except OSError:
        return -1


def _newest_pid() -> int:
    """The pid the kernel handed out last, to a process or a thread (the last field of
    ``loadavg``); -1 where that cannot be read."""
    try:
        with open(_LOADAVG, "rb") as f:
            return int(f.read().rsplit(None, 1)[-1])
    except (OSError, ValueError, IndexError):
        return -1


class _NotAScan(Exception):
    """The child answered what no scan gives."""


def _scan_answer(answer: object) -> tuple[list[int], list[Record]]:
    if not (
        isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[0], list) and isinstance(answer[1], list)
    ):
        raise _NotAScan("it answered something other than a scan")
    pids, changed = answer
    if not set(map(type, pids)) <= {int}:
        raise _NotAScan("it answered a pid that is not a number")
    for record in changed:
        if not (
            type(record) is tuple
            and len(record) == len(RECORD_TYPES)
            and all(isinstance(value, kind) for value, kind in zip(record, RECORD_TYPES, strict=True))
        ):
            raise _NotAScan(f"it answered a record that is not a process's: {str(record)[:80]}")
    return pids, changed


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


def proc_table() -> list[ProcessInfo]:
    """The table read from ``/proc`` (Linux), all of it afresh.  Raises OSError when
    ``/proc`` is unusable."""
    scan = ProcScan(keep=0)
    try:
        return [ProcessInfo(*record) for record in scan.scan()[1]]
    finally:
        scan.close()
