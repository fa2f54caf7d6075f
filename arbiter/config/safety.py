"""Whether a rule file is safe to take what only a trusted account may ask for from (a
command to run, requests that act on a program or carry credentials, GPU settings).

The file and every folder above it are owned by root or the daemon's user and writable by
nobody else, and the file is a regular file, not a symbolic link.  Other hard links to it are
no matter: owner and mode belong to the contents, whatever name reaches them (a package
installer that links files from its cache makes them).  A folder others may write is safe only with the sticky
bit, as ``/tmp`` has: there no one but an entry's owner may rename or remove it, and the
entry below is checked in turn.  The same policy holds for the state folder.  The file
system is read through ``lstat``/``readlink`` parameters so every case can be tested
without root.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Collection, Iterator

Lstat = Callable[[str], os.stat_result]
Readlink = Callable[[str], str]

_MAX_LINKS_FOLLOWED = 40


def _owner_and_mode(path: str, st: os.stat_result, trusted: Collection[int], what: str) -> str | None:
    if st.st_uid not in trusted:
        names = " or ".join(f"uid {u}" for u in sorted(trusted))
        return f"{what} {path} is owned by uid {st.st_uid}, not {names}"
    if st.st_mode & 0o022 and not (what == "the folder" and st.st_mode & stat.S_ISVTX):
        who = " and ".join(w for bit, w in ((0o020, "its group"), (0o002, "everyone")) if st.st_mode & bit)
        return f"{what} {path} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _folders(path: str, lstat: Lstat, readlink: Readlink) -> Iterator[tuple[str, os.stat_result]]:
    """Every folder and symbolic link met while resolving the folders above ``path``."""
    yield "/", lstat("/")
    pending = [c for c in os.path.dirname(os.path.abspath(path)).split("/") if c]
    current = "/"
    followed = 0
    while pending:
        part = pending.pop(0)
        if part == ".":
            continue
        if part == "..":
            current = os.path.dirname(current)
            continue
        nxt = os.path.join(current, part)
        st = lstat(nxt)
        yield nxt, st
        if stat.S_ISLNK(st.st_mode):
            followed += 1
            if followed > _MAX_LINKS_FOLLOWED:
                raise OSError(f"too many symbolic links resolving {path}")
            target = readlink(nxt)
            if os.path.isabs(target):
                current = "/"
            pending = [c for c in target.split("/") if c] + pending
        else:
            current = nxt


def command_file_problem(
    path: str, trusted: Collection[int] | None = None, lstat: Lstat = os.lstat, readlink: Readlink = os.readlink
) -> str | None:
    """Why ``path`` may not hold a rule that runs a command, or None when it may."""
    trusted = {0, os.geteuid()} if trusted is None else set(trusted)
    try:
        st = lstat(path)
        if stat.S_ISLNK(st.st_mode):
            return f"{path} is a symbolic link"
        if not stat.S_ISREG(st.st_mode):
            return f"{path} is not a regular file"
        return _owner_and_mode(path, st, trusted, "the file") or folders_problem(path, trusted, lstat, readlink)
    except OSError as exc:
        return f"cannot check {path}: {exc.strerror or exc}"


def folders_problem(
    path: str,
    trusted: Collection[int] | None = None,
    lstat: Lstat = os.lstat,
    readlink: Readlink = os.readlink,
    missing_ok: bool = False,
) -> str | None:
    """Why a folder above ``path`` (or a link met resolving them) could be changed by an
    account other than the trusted ones, or None.  ``missing_ok``: a folder not there yet
    ends the check (whoever makes it, below folders found safe, owns it); otherwise
    ``OSError`` is raised."""
    trusted = {0, os.geteuid()} if trusted is None else set(trusted)
    try:
        for folder, fst in _folders(path, lstat, readlink):
            if stat.S_ISLNK(fst.st_mode):
                if fst.st_uid not in trusted:
                    return f"the symbolic link {folder} is owned by uid {fst.st_uid}"
            elif not stat.S_ISDIR(fst.st_mode):
                return f"{folder} is not a folder"
            else:
                problem = _owner_and_mode(folder, fst, trusted, "the folder")
                if problem:
                    return problem
    except FileNotFoundError:
        if not missing_ok:
            raise
    return None
