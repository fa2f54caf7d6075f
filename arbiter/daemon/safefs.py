"""Files the daemon makes, made so that no other account can redirect them.

A path is resolved anew on every call that takes one: a folder some other account may
rename or replace can turn the daemon's ``chown`` or ``write`` into one on a file it never
meant to touch.  So each file is made inside a folder already open (``dir_fd``), never
through a link (``O_NOFOLLOW``), never over something already there (``O_EXCL``), with its
mode and owner set on the open descriptor (``fchmod``/``fchown``): whatever the umask, and
whatever is swapped in after.
"""

from __future__ import annotations

import os
from pathlib import Path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePath(OSError):
    """A path the daemon would make or open is not plainly its own."""


def open_dir(name: str | Path, dir_fd: int | None = None) -> int:
    """An existing folder, opened without following a link in its last part, that belongs to
    the daemon's own account; the descriptor is the caller's to close."""
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise UnsafePath(
            exc.errno, f"cannot open the folder {name}: {exc.strerror} (a link or not a folder?)"
        ) from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        os.close(fd)
        raise UnsafePath(f"the folder {name} is owned by uid {st.st_uid}, not the daemon's uid {os.geteuid()}")
    return fd


def make_dir(dir_fd: int, name: str, mode: int, exist_ok: bool = False) -> int:
    """The folder ``name`` in ``dir_fd`` (made when missing), with exactly ``mode``; an open
    descriptor on it, the caller's to close."""
    try:
        os.mkdir(name, mode, dir_fd=dir_fd)
    except FileExistsError:
        if not exist_ok:
            raise
    fd = open_dir(name, dir_fd)
    try:
        os.fchmod(fd, mode)  # the umask took bits off mkdir's mode, or none at all
    except BaseException:
        os.close(fd)
        raise
    return fd


def create_file(dir_fd: int, name: str, mode: int, owner: int | None = None, data: bytes = b"") -> None:
    """A new file ``name`` in ``dir_fd`` holding ``data``, with exactly ``mode`` and, where
    given, owned by ``owner`` (its group left as it is); fails if anything is there."""
    fd = os.open(name, NEW_FILE_FLAGS, mode, dir_fd=dir_fd)
    try:
        os.fchmod(fd, mode)
        if owner is not None and owner != os.geteuid():
            os.fchown(fd, owner, -1)
        if data:
            os.write(fd, data)
    finally:
        os.close(fd)


def replace_file(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    """Atomically put ``data`` at ``name`` in ``dir_fd``: a new file, then a rename that
    replaces a link or file there, never what a link points to."""
    tmp = f".{name}.{os.getpid()}.tmp"
    try:
        os.unlink(tmp, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    create_file(dir_fd, tmp, mode, data=data)
    try:
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        os.unlink(tmp, dir_fd=dir_fd)
        raise
