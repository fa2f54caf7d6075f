"""The kernel's process events (Linux's process-events connector), to learn which processes
of the table can have changed since it was last read.

A netlink socket subscribed to ``CN_IDX_PROC`` receives a message for every fork, exec,
change of uid, gid or name, and exit on the machine.  Nothing reads it between two reads of
the table: the messages wait in the socket, and :meth:`ProcEvents.changes` drains them when the
table is asked for, so that a quiet machine costs no wake-up at all.  Where the socket's
buffer overflowed, the kernel says so (``ENOBUFS``) and the table is read.

It needs ``CAP_NET_ADMIN`` (the kernel ignores a subscription without it, silently) and the
machine's own pid namespace (the connector speaks in its pids): where either is missing it is
not opened, and the table is read on every call, as without it.  What else would leave it
deaf (a network namespace of its own) the caller's periodic full read finds out: a process
born or gone that no event announced.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
NLMSG_DONE = 3
SO_RCVBUFFORCE = 33
CAP_NET_ADMIN = 12
PROC_PID_INIT_INO = 0xEFFFFFFC  # the machine's own pid namespace (the kernel's fixed number for it)

PROC_EVENT_FORK = 0x1
PROC_EVENT_EXEC = 0x2
PROC_EVENT_UID = 0x4
PROC_EVENT_GID = 0x40
PROC_EVENT_COMM = 0x200
PROC_EVENT_EXIT = 0x80000000
#: what changes a record of the table (a new program, owner or name) besides birth and death
_CHANGES = PROC_EVENT_EXEC | PROC_EVENT_UID | PROC_EVENT_GID | PROC_EVENT_COMM

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_CN_MSG = struct.Struct("=IIIIHH")  # idx, val, seq, ack, len, flags
_EVENT = struct.Struct("=IIQ")  # what, cpu, timestamp_ns
_PIDS = struct.Struct("=IIII")  # the first four words of the event's data
_HEADERS = _NLMSGHDR.size + _CN_MSG.size
RCVBUF_BYTES = 4 << 20


def unusable() -> str:
    """Why the connector cannot serve here ("" when it can)."""
    try:
        with open("/proc/self/status") as fh:
            caps = next((line.split()[1] for line in fh if line.startswith("CapEff:")), "0")
        if not int(caps, 16) >> CAP_NET_ADMIN & 1:
            return "it needs CAP_NET_ADMIN, which this process does not have"
        if os.readlink("/proc/self/ns/pid") != f"pid:[{PROC_PID_INIT_INO}]":
            return "this process runs in a pid namespace of its own: the connector speaks in the machine's pids"
    except (OSError, ValueError, StopIteration) as exc:
        return f"cannot tell whether it may listen: {exc}"
    return ""


SO_ATTACH_FILTER = 26
_INSN = struct.Struct("=HBBI")  # struct sock_filter (classic BPF): code, jt, jf, k


def attach_filter(sock: socket.socket, instructions: bytes) -> None:
    """Replace ``sock``'s filter by these classic BPF instructions.  Raises OSError."""
    program = ctypes.create_string_buffer(instructions)
    # struct sock_fprog: an unsigned short count, then (aligned) a pointer to the program
    layout = "HxxxxxxP" if struct.calcsize("P") == 8 else "HxxP"
    fprog = struct.pack(layout, len(instructions) // 8, ctypes.addressof(program))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


def subscribed(instructions: bytes = b"") -> socket.socket:
    """A connector socket subscribed to the machine's process events, with a receive buffer
    of :data:`RCVBUF_BYTES`; ``instructions``: a socket filter, attached before any event can
    queue.  Raises OSError."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_CONNECTOR)
    try:
        if instructions:
            attach_filter(sock, instructions)
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF_BYTES)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
        sock.bind((0, CN_IDX_PROC))
        op = struct.pack("=I", PROC_CN_MCAST_LISTEN)
        body = _CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(op), 0) + op
        sock.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(body), NLMSG_DONE, 0, 0, 0) + body)
    except OSError:
        sock.close()
        raise
    return sock


class ProcEvents:
    """A subscription to the process-events connector.  Raises OSError where it cannot be
    opened (see :func:`unusable`).  Not thread-safe: one caller at a time."""

    def __init__(self) -> None:
        why = unusable()
        if why:
            raise OSError(errno.EPERM, why)
        sock = subscribed()
        self._sock: socket.socket | None = sock
        self._born: set[int] = set()  # processes forked since the last call, alive then
        self.heard = False  # whether the last call received anything at all
        self.broken = ""  # why it no longer serves ("" while it does)

    def changes(self) -> set[int] | None:
        """The processes to read again since the last call: those born, and those that
        exited, exec'd or changed owner or name (a process born and gone between two calls is
        among them: its pid may be an older process's, and reading it finds it gone); None
        when events were lost or the socket failed (:attr:`broken` then says why): every
        process is to be read."""
        sock = self._sock
        if sock is None:
            return None
        born, touched = self._born, set[int]()
        lost = False
        self.heard = False
        while True:
            try:
                data = sock.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    lost = True  # messages were dropped: read them all, and go on listening
                    continue
                self.fail(f"reading its socket failed: {exc}")
                return None
            if not data:
                self.fail("its socket was closed")
                return None
            self.heard = True
            _take(data, born, touched)
        touched |= born
        born.clear()
        return None if lost else touched

    def fail(self, why: str) -> None:
        """Stop serving (the table is read on every call from now on), saying why."""
        self.broken = self.broken or why
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _take(data: bytes, born: set[int], touched: set[int]) -> None:
    """Take one datagram's events: a process forked into ``born``, one that was there before
    and changed into ``touched``, and one that exited into ``touched`` alone."""
    at = 0
    while at + _HEADERS + _EVENT.size + _PIDS.size <= len(data):
        length = _NLMSGHDR.unpack_from(data, at)[0]
        what = _EVENT.unpack_from(data, at + _HEADERS)[0]
        a, b, c, d = _PIDS.unpack_from(data, at + _HEADERS + _EVENT.size)
        if what == PROC_EVENT_FORK:
            if c == d:  # a new process, not a thread
                born.add(c)
        elif what == PROC_EVENT_EXIT:
            if a == b:
                # Kept in ``touched`` even when born since: its pid may name an older process
                # that exited before this one was forked (reading a pid that is gone costs one
                # failed open), and a scan that saw it in between is thereby told of it.
                born.discard(a)
                touched.add(a)
        elif what & _CHANGES and a == b and a not in born:
            touched.add(a)
        if length < _NLMSGHDR.size:
            break
        at += (length + 3) & ~3
