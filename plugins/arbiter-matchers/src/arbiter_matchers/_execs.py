"""Programs started, seen when they start: the kernel's process events on a socket of their
own that lets through only the exec of a program, so that the daemon looks again the moment a
protected program starts instead of at its next tick.

The socket carries a classic BPF filter (``SO_ATTACH_FILTER``) that drops every event but
``PROC_EVENT_EXEC`` in the kernel: forks, exits and a thread's every change of name are far
more frequent than execs, and would each wake the watch's thread.  That thread sleeps in
``poll`` with no timeout on the socket and a pipe that says it is to stop, so an idle desktop
(a few programs started a minute) costs a few wake-ups a minute; where programs start by the
dozen a second, those of half a second are taken together.  Each exec is read from
``/proc`` as the process table reads it (it may be gone already: then nothing is told) and
handed to the caller's ``starts``, which says whether it is worth a look.

The connector's needs (``CAP_NET_ADMIN``, the machine's pid namespace) are
:func:`arbiter_matchers._procevents.unusable`'s: where they are not met it is not opened.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable

from arbiter.plugin import ProcessInfo
from arbiter_matchers import _procevents
from arbiter_matchers._procscan import ProcScan, Record

log = logging.getLogger("arbiter.matchers.execs")

# classic BPF: load the event's ``what`` word, pass an exec whole, drop everything else
_BPF_LD_W_ABS = 0x20
_BPF_JEQ_K = 0x15
_BPF_RET_K = 0x06
_INSN = _procevents._INSN
#: a socket filter that lets nothing through
DROP_ALL = _INSN.pack(_BPF_RET_K, 0, 0, 0)
_WHAT_AT = _procevents._HEADERS  # the event follows the netlink and connector headers
_RECV_BYTES = 4096
#: the execs of this long after a batch are taken together: where programs start by the dozen
#: a second (a build, a scheduler's commands, a test suite) the thread wakes a few times a
#: second, not once an exec, and most of the short-lived ones are gone and cost one failed
#: open; a protected program is seen at most this much later than it started
BATCH_MS = 500
#: a read of a started program from ``/proc`` that has lasted this long is stuck in the kernel
#: (its command line waits on the address space of a process hung on a network filesystem or
#: a device): the watch is given up, and the tick, whose reads are bounded, finds what starts
READ_LIMIT_S = 5.0

Starts = Callable[[ProcessInfo], bool]


def unusable() -> str:
    """Why programs cannot be seen starting here ("" when they can)."""
    return _procevents.unusable()


def exec_filter() -> bytes:
    """The socket filter's instructions (``struct sock_filter``: code, jt, jf, k)."""
    # BPF loads a word in network byte order; the kernel writes ``what`` in the host's
    exec_word = int.from_bytes(struct.pack("=I", _procevents.PROC_EVENT_EXEC), "big")
    return b"".join(
        (
            _INSN.pack(_BPF_LD_W_ABS, 0, 0, _WHAT_AT),
            _INSN.pack(_BPF_JEQ_K, 0, 1, exec_word),
            _INSN.pack(_BPF_RET_K, 0, 0, 0xFFFFFFFF),
            DROP_ALL,
        )
    )


def exec_socket() -> socket.socket:
    """A connector socket subscribed to process events that receives execs alone.  Raises
    OSError where it cannot be had."""
    why = unusable()
    if why:
        raise OSError(errno.EPERM, why)
    # the execs of a pause between batches wait in its buffer: the default one holds about
    # 250, fewer than a build or a shell loop makes in half a second, and each overflow reads
    # as a start worth a look
    return _procevents.subscribed(exec_filter())


def exec_pids(data: bytes) -> list[int]:
    """The processes (thread group ids) whose exec one datagram tells of."""
    pids: list[int] = []
    at = 0
    ev = _procevents._EVENT
    while at + _procevents._HEADERS + ev.size + _procevents._PIDS.size <= len(data):
        length = _procevents._NLMSGHDR.unpack_from(data, at)[0]
        if ev.unpack_from(data, at + _procevents._HEADERS)[0] == _procevents.PROC_EVENT_EXEC:
            pids.append(_procevents._PIDS.unpack_from(data, at + _procevents._HEADERS + ev.size)[1])
        if length < _procevents._NLMSGHDR.size:
            break
        at += (length + 3) & ~3
    return pids


class ExecWatch:
    """Calls ``started`` (on its own thread) when a program starts that the ``starts`` it was
    last given selects; nothing while it was given None.  Raises OSError where the connector
    cannot be had, RuntimeError where no thread can be started."""

    #: what it watches, as a log line names it
    WHAT = "a protected program's start"

    def __init__(self, started: Callable[[], None]) -> None:
        self._started = started
        self._lock = threading.Lock()
        self._starts: Starts | None = None
        self._closed = False
        self._ended = False  # its thread returned
        self._broken = ""
        self._reading_since = 0.0  # monotonic, while it reads started programs from /proc (else 0)
        self._sock = exec_socket()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(target=self._run, name="arbiter-execs", daemon=True)
        try:
            self._thread.start()
        except BaseException:
            self._release()
            raise

    @property
    def broken(self) -> str:
        """Why it stopped watching ("" while it watches); once said, it stands."""
        since = self._reading_since
        if not self._broken and since and time.monotonic() - since > READ_LIMIT_S:
            self._broken = f"reading a started program from /proc has not returned for over {READ_LIMIT_S:g} s"
        return self._broken

    def watch(self, starts: Starts | None) -> None:
        """Judge the programs started from now on by ``starts`` (None: none is worth a look)."""
        with self._lock:
            self._starts = starts

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            stuck = False
            if self._ended:
                self._release()
            else:  # its thread releases the descriptors as it ends
                with contextlib.suppress(BlockingIOError):
                    os.write(self._wake_w, b".")
                stuck = bool(self.broken) and self._reading_since != 0.0
                if stuck:  # the kernel queues no more execs for a thread that may never read them
                    with contextlib.suppress(OSError):
                        _procevents.attach_filter(self._sock, DROP_ALL)
        # a thread stuck in a read of /proc is not waited for: the caller is the tick
        self._thread.join(timeout=0 if stuck else 2)

    def _release(self) -> None:
        self._sock.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _run(self) -> None:
        try:
            self._watch()
        except Exception as exc:  # the tick finds what it would have told
            self._broken = f"its thread failed: {type(exc).__name__}: {exc}"
            log.exception("programs are no longer seen starting (the tick finds them)")
        finally:
            with self._lock:
                self._ended = True
                if self._closed:
                    self._release()

    def _watch(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        poller.register(self._sock.fileno(), select.POLLIN)
        pause = select.poll()  # between two batches: only a close ends it early
        pause.register(self._wake_r, select.POLLIN)
        scan = ProcScan(0)  # keeps no descriptor: each process is read once
        while True:
            events = poller.poll()
            with self._lock:
                if self._closed:
                    return
            if not any(fd == self._sock.fileno() for fd, _ in events):
                continue
            pids: list[int] = []
            try:
                while True:
                    try:
                        pids += exec_pids(self._sock.recv(_RECV_BYTES, socket.MSG_DONTWAIT))
                    except BlockingIOError:
                        break
                    except OSError as exc:
                        if exc.errno != errno.ENOBUFS:
                            raise
                        pids.append(0)  # execs were dropped: one of them may be worth a look
            except OSError as exc:
                self._broken = f"reading its socket failed: {exc}"
                log.warning("programs are no longer seen starting (the tick finds them): %s", self.broken)
                return
            with self._lock:  # taken after the execs were: one told after a call of ``watch`` is judged by it
                starts = self._starts
            if starts is not None and pids and self._worth_a_look(starts, pids, scan):
                with self._lock:
                    if self._closed:
                        return
                try:
                    self._started()
                except Exception:  # the watch goes on; the tick finds what it missed
                    log.exception("telling that a program started failed")
            pause.poll(BATCH_MS)

    def _read(self, scan: ProcScan, pid: int) -> list[Record]:
        """The process's record, timed (see :attr:`broken`).  Raises OSError."""
        self._reading_since = time.monotonic()
        try:
            return scan.read([pid])[1]
        finally:
            self._reading_since = 0.0
            scan.forget([pid])

    def _worth_a_look(self, starts: Starts, pids: list[int], scan: ProcScan) -> bool:
        if 0 in pids:
            return True
        for pid in dict.fromkeys(pids):
            try:
                records = self._read(scan, pid)
            except OSError:
                return True  # /proc failed: let the tick look
            if not records:
                continue  # gone already: it ran too briefly to protect
            try:
                if starts(ProcessInfo(*records[0])):
                    return True
            except Exception:  # a matcher's failure is the tick's to report
                log.debug("judging a started program failed", exc_info=True)
                return True
        return False
