"""What the daemon's processes set for themselves at start: their open-file limit and
their malloc arenas."""

from __future__ import annotations

import ctypes
import os

try:
    import resource
except ImportError:  # pragma: no cover - not a POSIX host
    resource = None  # type: ignore[assignment]

#: the soft open-file limit the daemon raises itself to, where the hard limit allows
OPEN_FILES_WANTED = 65536


def raise_open_file_limit(wanted: int = OPEN_FILES_WANTED) -> tuple[int, int] | None:
    """Raise this process's soft open-file limit to ``wanted`` (or the hard limit, if lower):
    plugins keep a share of it open between ticks (``open_file_share``), and a service
    manager's usual soft limit, 1024, leaves the process table a quarter of a thousand
    processes' files, so it opens and closes the rest on every tick.  Returns (before,
    after) when it raised it, None when it did not need to or could not."""
    if resource is None:
        return None
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if soft == resource.RLIM_INFINITY or soft >= target:
            return None
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError):
        return None
    return soft, target


#: malloc arenas a daemon process keeps.  glibc gives each thread that allocates an arena of
#: its own, up to eight per core; the daemon's threads allocate under one interpreter lock,
#: so more than two buy nothing but memory (bench/load.py prints the daemon's RSS).
MALLOC_ARENAS = 2
#: mallopt's parameter for that cap, in glibc's malloc.h
_M_ARENA_MAX = -8


def cap_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap this process's malloc arenas at ``arenas``, before it starts threads; True when
    it did.  A ``MALLOC_ARENA_MAX`` in the environment is the person's choice and stands;
    a C library other than glibc is left as it is."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    try:
        if not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
            return False
        mallopt = ctypes.CDLL(None).mallopt
    except (ValueError, OSError, AttributeError):
        return False
    return bool(mallopt(_M_ARENA_MAX, arenas))
