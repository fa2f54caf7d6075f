"""Opening a file named by a path in a folder another account may change (Linux: O_PATH and
/proc/self/fd; elsewhere a non-blocking open checked after).

Checking a path (``stat``) and then opening it by name lets the path change in between:
a file checked regular may be a FIFO (an open that blocks) or a device (an open with side
effects) by the time it is opened.  So nothing is checked by name: the path is opened
first in a way that reads nothing and has no side effects (``O_PATH`` where the system has
it), the descriptor is checked, and only the very file checked is then opened for reading
(through ``/proc/self/fd``, never by its name again).  Where there is no ``O_PATH`` the
file is opened non-blocking, without taking a terminal, and checked after.
"""

from __future__ import annotations

import errno
import os
import stat

_O_PATH = getattr(os, "O_PATH", 0)
_READ = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)


class NotRegularFile(OSError):
    """The path names something other than a regular file (a folder, a FIFO, a device)."""


def open_regular(path: str, follow_links: bool = True, dir_fd: int | None = None) -> tuple[int, os.stat_result]:
    """A descriptor for reading the regular file at ``path``, and its ``fstat``.

    ``follow_links=False`` refuses a link as the last part (``ELOOP``).  Raises
    :class:`NotRegularFile` for anything not a regular file, without having opened it for
    reading, and ``OSError`` as ``open`` does otherwise.  Reads from the descriptor do not
    block (a file, they never need to).
    """
    nofollow = 0 if follow_links else os.O_NOFOLLOW
    if _O_PATH and os.path.isdir("/proc/self/fd"):
        probe = os.open(path, _O_PATH | os.O_CLOEXEC | nofollow, dir_fd=dir_fd)
        try:
            st = os.fstat(probe)
            if stat.S_ISLNK(st.st_mode):  # O_PATH|O_NOFOLLOW opens the link itself
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
            if not stat.S_ISREG(st.st_mode):
                raise NotRegularFile(errno.EINVAL, _what(st), path)
            fd = os.open(f"/proc/self/fd/{probe}", _READ)
        finally:
            os.close(probe)
    else:
        fd = os.open(path, _READ | nofollow, dir_fd=dir_fd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegularFile(errno.EINVAL, _what(st), path)
    return fd, st


def _what(st: os.stat_result) -> str:
    if stat.S_ISDIR(st.st_mode):
        return "a directory, not a file"
    return "not a regular file"
