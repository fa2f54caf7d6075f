"""Per-descriptor kqueue watches (macOS and the BSDs): just what a file follower needs."""

from __future__ import annotations

import os
import select
import sys
from collections.abc import Iterable

_EVENTS_ONLY = getattr(os, "O_EVTONLY", 0)  # macOS: watch without keeping a volume busy


if sys.platform != "linux" and sys.platform != "win32":  # select.kqueue: macOS and the BSDs

    class Kqueue:
        """Watches directories and one open file for any change, and a wake-up pipe."""

        @staticmethod
        def supported() -> bool:
            return hasattr(select, "kqueue")

        def __init__(self, wake_fd: int) -> None:
            self._kq = select.kqueue()
            self._dirs: dict[str, int] = {}  # path -> descriptor opened only to be watched
            self._file: int | None = None
            self._kq.control([select.kevent(wake_fd, select.KQ_FILTER_READ, select.KQ_EV_ADD)], 0, 0)

        @staticmethod
        def _vnode(fd: int, flags: int) -> select.kevent:
            fflags = (
                select.KQ_NOTE_WRITE
                | select.KQ_NOTE_EXTEND
                | select.KQ_NOTE_DELETE
                | select.KQ_NOTE_RENAME
                | select.KQ_NOTE_ATTRIB
                | select.KQ_NOTE_REVOKE
            )
            return select.kevent(fd, select.KQ_FILTER_VNODE, flags | select.KQ_EV_CLEAR, fflags)

        def watch(self, directories: Iterable[str], file_fd: int | None) -> bool:
            """Watch exactly these directories and this file; False when one could not be watched."""
            # First forget the old file: its number may be reused by a folder opened below.
            if self._file is not None and self._file != file_fd and self._file not in self._dirs.values():
                try:
                    self._kq.control([self._vnode(self._file, select.KQ_EV_DELETE)], 0, 0)
                except OSError:
                    pass  # the follower closed it already, which removed the kevent
            self._file = None
            wanted = set(directories)
            complete = True
            for path in list(self._dirs):
                if path not in wanted:
                    os.close(self._dirs.pop(path))  # closing a descriptor removes its kevent
            for path in wanted - set(self._dirs):
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | _EVENTS_ONLY)
                except OSError:
                    complete = False  # missing or unreadable: checked on the interval instead
                    continue
                try:
                    self._kq.control([self._vnode(fd, select.KQ_EV_ADD)], 0, 0)
                except OSError:
                    os.close(fd)
                    complete = False
                    continue
                self._dirs[path] = fd
            if file_fd is not None:
                # added again even under the same number: a reopened file is a new descriptor
                self._kq.control([self._vnode(file_fd, select.KQ_EV_ADD)], 0, 0)
                self._file = file_fd
            return complete

        def wait(self, timeout_s: float) -> bool:
            """Wait for any change (or the wake-up); True when something happened."""
            return bool(self._kq.control(None, 16, timeout_s))

        def close(self) -> None:
            for fd in self._dirs.values():
                os.close(fd)
            self._dirs.clear()
            self._kq.close()

else:
    # select has no kqueue here (typeshed says so too): the follower uses inotify or polling.

    class Kqueue:
        """Stands in where there is no kqueue: :meth:`supported` is False, so none is made."""

        @staticmethod
        def supported() -> bool:
            return False

        def __init__(self, wake_fd: int) -> None:
            raise OSError("kqueue is not available on this platform")

        def watch(self, directories: Iterable[str], file_fd: int | None) -> bool:
            raise OSError("kqueue is not available on this platform")

        def wait(self, timeout_s: float) -> bool:
            raise OSError("kqueue is not available on this platform")

        def close(self) -> None:
            pass
