"""Processes watched for their end through pidfds (Linux 5.3 and later), so that the daemon
looks again the moment a protected program has ended instead of at its next tick.

One thread sleeps in ``poll`` on a pidfd per watched process and a pipe that says the set
changed: a node whose protected programs run on, or where none runs, costs no wake-up at all.
A pidfd turns readable once every thread of its process has ended, while the process may
still wait for its parent as a zombie.  A pid that is gone before its pidfd is opened counts
as ended; one handed out again meanwhile is watched in its new owner's stead, which only
delays the look to the tick that would have come anyway.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import threading
from collections.abc import Callable, Iterable

from arbiter.plugin import open_file_share

log = logging.getLogger("arbiter.matchers.exits")

#: a group of more processes than this is left to the tick (a build's or a shell's many
#: short-lived children would each cost a pidfd, and their end says little)
MAX_GROUP = 64
#: pidfds held at most, where the open-file limit allows (an eighth of it otherwise: the
#: process table keeps a quarter, and the daemon's sockets and children need the rest)
MAX_PIDFDS = 256


def unusable() -> str:
    """Why processes cannot be watched for their end here ("" when they can)."""
    if not hasattr(os, "pidfd_open") or not hasattr(select, "poll"):
        return "this platform has no pidfds"
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError as exc:  # an old kernel (ENOSYS), a sandbox that forbids it (EPERM)
        return f"pidfds cannot be had here: {errno.errorcode.get(exc.errno or 0, exc.strerror)}"
    return ""


class ExitWatch:
    """Calls ``ended`` (on its own thread) with the pids of the groups it was last given
    that have ended, each process of the group; once per group while it stays asked for."""

    #: what it watches, as a log line names it
    WHAT = "a protected program's end"
    #: why it stopped watching ("" while it watches): it does not stop but with the daemon
    broken = ""

    def __init__(self, ended: Callable[[frozenset[int]], None]) -> None:
        self._ended = ended
        self._lock = threading.Lock()
        self._asked: tuple[frozenset[int], ...] = ()  # what the last call asked for, capped
        self._closed = False
        self._most = min(MAX_PIDFDS, open_file_share(8, MAX_PIDFDS))
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(target=self._run, name="arbiter-exits", daemon=True)
        try:
            self._thread.start()
        except BaseException:
            os.close(self._wake_r)
            os.close(self._wake_w)
            raise

    def watch(self, groups: Iterable[frozenset[int]]) -> None:
        """Watch these groups instead of the last ones (the smallest first, within the caps)."""
        kept: list[frozenset[int]] = []
        total = 0
        for group in sorted((g for g in groups if 0 < len(g) <= MAX_GROUP), key=lambda g: (len(g), min(g))):
            if total + len(group) > self._most:
                break
            kept.append(group)
            total += len(group)
        with self._lock:  # the pipe is closed under it: no byte goes to a descriptor reused since
            if self._closed:
                return
            self._asked = tuple(kept)
            self._ring()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._ring()
        self._thread.join(timeout=2)
        with self._lock:
            if not self._thread.is_alive():  # else it may still poll the pipe: leave it open
                os.close(self._wake_r)
                os.close(self._wake_w)

    def _ring(self) -> None:
        with contextlib.suppress(BlockingIOError):  # a byte already waiting says the same
            os.write(self._wake_w, b".")

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        fds: dict[int, int] = {}  # pid -> its pidfd
        pids_of: dict[int, int] = {}  # pidfd -> its pid
        ended: set[int] = set()  # watched pids seen ended
        fired: set[frozenset[int]] = set()  # groups told of
        try:
            while True:
                for fd, _ in poller.poll():
                    if fd == self._wake_r:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 4096)
                    elif fd in pids_of:
                        ended.add(pids_of[fd])
                        poller.unregister(fd)  # readable from now on: it would wake the loop for ever
                with self._lock:
                    if self._closed:
                        return
                    asked = self._asked
                wanted = set().union(*asked)
                for pid in [p for p in fds if p not in wanted]:
                    fd = fds.pop(pid)
                    del pids_of[fd]
                    with contextlib.suppress(KeyError):
                        poller.unregister(fd)
                    os.close(fd)
                for pid in wanted - fds.keys() - ended:
                    try:
                        fd = os.pidfd_open(pid)
                    except ProcessLookupError:
                        ended.add(pid)
                        continue
                    except OSError as exc:  # out of descriptors, say: this pid is left to the tick
                        log.debug("cannot watch process %d: %s", pid, exc)
                        continue
                    fds[pid], pids_of[fd] = fd, pid
                    poller.register(fd, select.POLLIN)
                ended &= wanted
                # a group is forgotten once none of its processes is asked for: a group asked
                # for again, whole, after others were, is not told of twice
                fired = {g for g in fired if g & wanted}
                done = [g for g in asked if g not in fired and g <= ended]
                if done:
                    fired.update(done)
                    try:
                        self._ended(frozenset().union(*done))
                    except Exception:  # the watch goes on; the tick notices what it missed
                        log.exception("telling that a watched process ended failed")
        finally:
            for fd in fds.values():
                os.close(fd)
