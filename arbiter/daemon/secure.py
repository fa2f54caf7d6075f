"""The state directory and the HTTP token in it: the daemon's account alone writes the
one and reads the other.

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
from pathlib import Path

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
    token, why = _existing(path)
    if token is not None:
        return token
    if why:
        log.warning("replacing %s with a new token: %s", path, why)
    token = secrets.token_urlsafe(TOKEN_BYTES)
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
            f"cannot write the HTTP token to {path}: {exc.strerror or exc}; "
            f"remove what is there ({why or 'it is in the way'}) and start again"
        ) from None
    return token


class UnsafeStateDir(Exception):
    """The state directory belongs to someone else."""


def check_state_dir(path: Path) -> None:
    """Make ``path`` (created if missing) the daemon's own and writable by it alone.

    Another account owning it could swap the socket, the token or the paused record under
    the daemon, so that refuses to start rather than being repaired.
    """
    path.mkdir(parents=True, exist_ok=True)
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeStateDir(f"state_dir {path} is not a directory; point state_dir at a folder")
    if st.st_uid != os.geteuid():
        raise UnsafeStateDir(
            f"state_dir {path} is owned by uid {st.st_uid}, not by the daemon's uid {os.geteuid()}: "
            f"another account could replace its socket or token; `chown {os.geteuid()} {path}` or choose another state_dir"
        )
    os.chmod(path, 0o755)  # anyone may reach the socket and daemon.json; only the daemon writes
