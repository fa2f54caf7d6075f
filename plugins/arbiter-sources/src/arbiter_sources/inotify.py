"""A minimal inotify binding (ctypes, Linux): just what a file watcher needs."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys
from typing import NamedTuple

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000

IN_CLOEXEC = 0o2000000
IN_NONBLOCK = 0o4000

#: what a directory watch asks for: writes to its files and files coming and going
DIRECTORY_EVENTS = (
    IN_MODIFY
    | IN_CLOSE_WRITE
    | IN_CREATE
    | IN_MOVED_TO
    | IN_MOVED_FROM
    | IN_DELETE
    | IN_ATTRIB
    | IN_DELETE_SELF
    | IN_MOVE_SELF
)

#: what a watch on the followed file itself asks for: written, renamed or deleted, or its
#: attributes changed (its link count falls when it is deleted or renamed over while open)
FILE_EVENTS = IN_MODIFY | IN_CLOSE_WRITE | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF

_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len: struct inotify_event without its name
_READ_BYTES = 65536
_LARGEST_EVENT = _HEADER.size + 256  # a name of NAME_MAX (255) bytes and its NUL


#: how names are decoded, as os.fsdecode does (without its two Python calls an event)
_FS_ENCODING, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()


class Event(NamedTuple):
    """One event (a tuple: a phase line's wake-up makes one or two, on the fast path)."""

    wd: int
    mask: int
    cookie: int
    name: str


class Inotify:
    """An inotify instance.  Raises OSError where inotify is missing or refused."""

    def __init__(self) -> None:
        if not sys.platform.startswith("linux"):
            raise OSError(errno.ENOSYS, "inotify exists only on Linux")
        # The interpreter's own symbols include the C library's; ctypes.util.find_library
        # would run ldconfig in a subprocess on every source start.
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            self._init1 = libc.inotify_init1
            self._add = libc.inotify_add_watch
            self._rm = libc.inotify_rm_watch
        except AttributeError:
            raise OSError(errno.ENOSYS, "this C library has no inotify") from None
        self._init1.argtypes = [ctypes.c_int]
        self._init1.restype = ctypes.c_int
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._add.restype = ctypes.c_int
        self._rm.argtypes = [ctypes.c_int, ctypes.c_int]
        self._rm.restype = ctypes.c_int
        fd = self._init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        self._fd: int | None = fd

    def fileno(self) -> int:
        if self._fd is None:
            raise ValueError("inotify instance is closed")
        return self._fd

    def add_watch(self, path: str, mask: int) -> int:
        wd = self._add(self.fileno(), os.fsencode(path), mask)
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
        return int(wd)

    def rm_watch(self, wd: int) -> None:
        self._rm(self.fileno(), wd)  # failure only means the kernel already dropped it

    def read_events(self) -> list[Event]:
        """Every event queued now (none when there are none: the descriptor never blocks)."""
        events: list[Event] = []
        while True:
            try:
                data = os.read(self.fileno(), _READ_BYTES)
            except BlockingIOError:
                return events
            if not data:
                return events
            offset = 0
            while offset + _HEADER.size <= len(data):
                wd, mask, cookie, length = _HEADER.unpack_from(data, offset)
                offset += _HEADER.size
                # a watch on a file itself names nothing: no bytes to decode
                name = (
                    data[offset : offset + length].split(b"\0", 1)[0].decode(_FS_ENCODING, _FS_ERRORS) if length else ""
                )
                offset += length
                events.append(Event(wd, mask, cookie, name))
            if len(data) <= _READ_BYTES - _LARGEST_EVENT:
                # all that was queued fitted: no second read to be told so (each read lets
                # the interpreter lock go, and waits for it under load); later events wake
                # the next poll
                return events

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
