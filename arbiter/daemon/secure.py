"""The state directory and the secrets in it (the HTTP token, the key that signs the
certificates this node publishes): the daemon's account alone writes the one and reads the
others.

Whoever reads the token may reload the daemon over HTTP (and, on a listener other hosts
can reach, read anything), so a file that others could have read, or that is not plainly
the daemon's own (a link, someone else's file, a second name for another file), is not
trusted: a new token replaces it.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

from arbiter.config.safety import folders_problem

log = logging.getLogger("arbiter.daemon")

TOKEN_BYTES = 32
#: a token shorter than this was not written by arbiter (token_urlsafe(32) gives 43)
MIN_TOKEN_CHARS = 32


def _existing(path: Path) -> tuple[str | None, str]:
    """(the token in ``path`` if it can be kept, else None and why it cannot)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, ""
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None, "it is a symbolic link"
        return None, f"it cannot be opened: {exc.strerror or exc}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "it is not a regular file"
        if st.st_uid != os.geteuid():
            return None, f"it is owned by uid {st.st_uid}, not the daemon's uid {os.geteuid()}"
        if st.st_nlink != 1:
            return None, f"it has {st.st_nlink} names (hard links)"
        if stat.S_IMODE(st.st_mode) & 0o077:
            return None, f"its mode was {stat.S_IMODE(st.st_mode):04o}, so others may have read it"
        token = os.read(fd, 4096).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    if len(token) < MIN_TOKEN_CHARS or not token.isascii() or not token.isprintable():
        return None, "it does not hold a token arbiter wrote"
    return token, ""


def ensure_token(path: Path) -> str:
    """The token to accept, made (mode 0600) when there is none that can be kept."""
    return ensure_secret(path, lambda: secrets.token_urlsafe(TOKEN_BYTES), "the HTTP token")


def ensure_secret(path: Path, make: Callable[[], str], what: str) -> str:
    """The secret in ``path`` (printable ASCII, at least :data:`MIN_TOKEN_CHARS`), made by
    ``make`` and written (mode 0600) when there is none that can be kept."""
    token, why = _existing(path)
    if token is not None:
        return token
    if why:
        log.warning("replacing %s with a new one (%s): %s", path, what, why)
    token = make()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.unlink()
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, token.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)  # replaces a link itself, never what it points to
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UnsafeStateDir(
            f"cannot write {what} to {path}: {exc.strerror or exc}; "
            f"remove what is there ({why or 'it is in the way'}) and start again"
        ) from None
    return token


class UnsafeStateDir(Exception):
    """The state directory belongs to someone else."""


def check_state_dir(path: Path) -> None:
    """Make ``path`` (created if missing) the daemon's own and writable by it alone.

    Every folder above it must be root's or the daemon's and writable by no one else (or
    sticky, as ``/tmp``): whoever may rename a folder on the way may swap the job folders
    under the daemon between its ``mkdir`` and its ``chown``.  Another account owning the
    folder itself could swap the socket, the token or the paused record, so neither is
    repaired: the start is refused, saying which folder and what to do.
    """
    path = Path(os.path.abspath(path))
    problem = folders_problem(str(path), missing_ok=True)
    if problem:
        raise UnsafeStateDir(
            f"state_dir {path} is not safe for the daemon: {problem}; another account could swap what the daemon "
            f"makes there. Choose a state_dir whose every folder is owned by root or uid {os.geteuid()} and writable "
            "by no one else (e.g. /var/lib/arbiter, or a folder in the daemon user's home)"
        )
    missing = []
    for folder in (path, *path.parents):
        if os.path.lexists(folder):
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o755)
            os.chmod(folder, 0o755)  # the umask took bits off, or none: a folder above is checked safe
        except FileExistsError:
            pass
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeStateDir(f"state_dir {path} is not a directory; point state_dir at a folder")
    if st.st_uid != os.geteuid():
        raise UnsafeStateDir(
            f"state_dir {path} is owned by uid {st.st_uid}, not by the daemon's uid {os.geteuid()}: "
            f"another account could replace its socket or token; `chown {os.geteuid()} {path}` or choose another state_dir"
        )
    os.chmod(path, 0o755)  # anyone may reach the socket and daemon.json; only the daemon writes
    check_recorded_state(path)


#: what the daemon reads back at start: rows in them name processes to signal and files to write
RECORDED = ("state.db", "state.db-wal", "state.db-shm", "paused.journal")


def check_recorded_state(path: Path) -> None:
    """Refuse a state folder, or a record in it, that another account could have written:
    the folder and its parents as :func:`check_state_dir` wants them, each record a regular
    file of root's or the daemon's that no one else may write."""
    path = Path(os.path.abspath(path))
    problem = folders_problem(str(path / "x"), missing_ok=True)  # the state folder itself too
    trusted = {0, os.geteuid()}
    for name in RECORDED:
        if problem:
            break
        try:
            st = os.lstat(path / name)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            problem = f"{path / name} is not a plain file (a link, or several names)"
        elif st.st_uid not in trusted:
            problem = f"{path / name} is owned by uid {st.st_uid}"
        elif st.st_mode & 0o022:
            problem = f"{path / name} is writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
    if problem:
        raise UnsafeStateDir(
            f"the state in {path} is not trusted: {problem}; another account could have written what it records. "
            "Nothing was resumed or signalled: look at the folder, and name the right one with --config"
        )
