"""Following a file a protected program appends to, as ``tail -F`` does.

A glob in the last path component follows the newest match; renames and truncation are
followed; partial lines wait for their newline (or, where the subclass says so, a carriage
return: a progress bar rewrites one line with ``\r``).  Changes are seen through inotify on
Linux and kqueue on macOS and the BSDs (a line reaches ``on_change`` within a millisecond),
and by checking every 250 ms elsewhere.  A source that only counts lines reads at most
every 50 ms (:data:`COUNT_PACE_S`); one that gives a phase reads at every write.
Subclasses say what a line means.

Which file the path names is :mod:`arbiter_sources.follow_path`'s, what wakes the thread
:mod:`arbiter_sources.follow_watch`'s, splitting bytes into lines
:mod:`arbiter_sources.follow_lines`'s, and what the lines mean
:mod:`arbiter_sources.follow_meaning`'s.  What stays here runs past 400 lines because it is one
state machine under one lock: the open file, its position and the bytes before it, the
positions of files followed before, and the grace a renamed file keeps, which the watcher
thread and ``state()`` both drive; split, each half would reach into the other's fields.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable
from typing import ClassVar

from arbiter.plugin import Phase, PluginContext, PluginError, Source, SourceState
from arbiter_sources import inotify
from arbiter_sources.follow_lines import (
    CHUNK,
    TAIL_BYTES,
    LineSplitter,
    end_of_last_line,
    read_tail,
)
from arbiter_sources.follow_lines import MAX_LINE_BYTES as MAX_LINE_BYTES  # what a caller imports from here
from arbiter_sources.follow_meaning import LineMeaning as LineMeaning  # what a subclass imports from here
from arbiter_sources.follow_meaning import LineTally
from arbiter_sources.follow_path import FollowedPath, FollowOptions, Problem
from arbiter_sources.follow_watch import Notifications
from arbiter_sources.kqueue import Kqueue
from arbiter_sources.safeopen import NotRegularFile, open_regular

log = logging.getLogger(__name__)

#: check interval without file notifications
POLL_INTERVAL_S = 0.25
#: with notifications, a check this often anyway, in case an event was missed (a folder
#: above the watched one renamed or replaced, a file written from another host over a network
#: file system): local writes, renames and deletions are all heard, so the thread of a file
#: nothing writes, in the daemon and in the reflex process, otherwise sleeps; an idle node's
#: watchers woke once a second each for nothing
SAFETY_INTERVAL_S = 10.0
#: how long a file renamed away is still followed while nothing replaces it (its writer
#: may write a last line before it reopens the path)
ROTATION_GRACE_S = 10.0
#: a source that only counts lines (it gives no phase) reads at most this often while
#: file notifications wake it: the count becomes a rate over seconds, and a program that
#: writes two hundred times a second otherwise wakes this thread, and the daemon's decision
#: thread with each report, as often, each time taking the interpreter from the fast path.
#: A rate taken between two reads misses what came since the last: over a 5 s window, 0.5 %
#: on average and 1 % at most; a program that writes twenty times a second or less is read
#: at every write.  Each read costs a wake-up of this thread whatever it takes in, so a
#: program writing ten thousand lines a second is read in twenty batches, not a hundred
COUNT_PACE_S = 0.05
#: the most one read of the file takes in (a wake-up's pass): a file that has grown more
#: than this since it was last read is no log a program writes (a sparse file of terabytes
#: of holes reads as zeros without end), and counts as unreadable until it is truncated or
#: replaced; the thread never spends more than one such pass before it looks up again
MAX_PASS_BYTES = 64 << 20
#: positions remembered for files followed before (a glob may switch back to one)
_REMEMBERED_FILES = 16


class FollowedFile(LineTally, Source):
    """Follows one file (or the newest file a glob matches) and counts the lines that match."""

    kind = "file"
    Options: ClassVar[type[FollowOptions]] = FollowOptions
    #: a carriage return ends a line too (progress bars redraw one line with ``\r``)
    splits_cr: ClassVar[bool] = False

    def __init__(self, options: FollowOptions, context: PluginContext) -> None:
        super().__init__(options, context)
        self.options: FollowOptions = options
        self._where = FollowedPath.of(options.path)
        self._history_needles: tuple[bytes, ...] = ()

        self.malformed = 0
        self._count = 0
        self._phase: Phase | None = "off" if options.gives_phase() else None
        self._readable = False
        self._why = "not read yet"
        self._needs_helper = False
        self._state = SourceState(readable=False, phase=self._phase, why=self._why)

        # The file being followed.
        self._fd: int | None = None
        self._ident: tuple[int, int] | None = None
        self._name = ""  # its name in the directory, as last seen (follows renames)
        self._pos = 0
        self._lines = LineSplitter(self.splits_cr)
        self._tail = b""  # the bytes just before _pos, to notice the file rewritten in place
        self._skip_history = True  # until the first poll finds the file missing
        self._positions: dict[tuple[int, int], tuple[int, bytes]] = {}  # ident -> (pos, tail)

        self._lock = threading.Lock()
        self._wake_lock = threading.Lock()  # the wake-up pipe's writers and its closing
        self._on_change: Callable[[SourceState], None] | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._wake_r: int | None = None
        self._wake_w: int | None = None
        self._notes = Notifications()
        self._closed = False
        # another process watches this file and tells the daemon each change: no wake per write
        self._elsewhere = False
        self._target_name = ""  # the followed file's own name where the path is a symlink
        self._last_full = 0.0  # monotonic time of the last full check
        self._gone_since: float | None = None  # the path lost its file while we kept it open

    # --- the Source API ------------------------------------------------------------------

    def start(self, on_change: Callable[[SourceState], None]) -> None:
        """Read the file once (state() is current when this returns), then watch it."""
        with self._lock:
            if self._closed:
                raise PluginError(f"the {self.kind} source for {self._where.pattern} was closed; create a new one")
            self._on_change = on_change
            if self._thread is not None:
                return
            self._stopping = False
            self._wake_r, self._wake_w = os.pipe()
            try:
                self._notes.open(self._wake_r)
            except OSError as exc:
                log.info(
                    "%s source %s: no file notifications (%s); checking every %.2f s",
                    self.kind,
                    self._where.pattern,
                    exc,
                    POLL_INTERVAL_S,
                )
            # Watch before the first read, so no write falls between the two unseen.
            self._ensure_watches()
            self._poll(rescan=True)
            self._last_full = time.monotonic()  # that was a full check: the next is an interval away
            self._ensure_watches()
            self._thread = threading.Thread(
                target=self._run, name=f"arbiter-{self.kind}:{self._where.pattern}", daemon=True
            )
            self._thread.start()

    def watched_elsewhere(self, elsewhere: bool) -> None:
        """While another process reads each write of this file for the daemon, this thread
        reads it on the safety check only: a phase line then wakes one reader at the moment
        its pauses are made, not two competing for the cores.  Once that ends, it reads at once
        and wakes for each write again."""
        # not under the read lock: a long read must not make the daemon give this call up
        # and leave the file resting with nobody else reading it
        with self._wake_lock:
            if elsewhere == self._elsewhere:
                return
            self._elsewhere = elsewhere
            if self._wake_w is not None:
                # its wait changes now (and once that ends, what came meanwhile is read now)
                os.write(self._wake_w, b"w")

    def state(self) -> SourceState:
        if (self._thread is None or self._elsewhere) and not self._closed:
            # Not watched, or resting while another process reads it (which may stall): read
            # now, the path resolved again (a log rotated meanwhile is followed), so a caller
            # on a tick still gets news, at no wake-up of its own
            changed = None
            with self._lock:
                if (self._thread is None or self._elsewhere) and not self._closed:
                    changed = self._poll(rescan=True)
            callback = self._on_change
            if changed is not None and callback is not None and self._thread is not None:
                # reported as the watcher reports: what the daemon set aside stays the newest
                callback(changed)
        return self._state

    def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
            self._stopping = self._closed = True
            if self._wake_w is not None:
                os.write(self._wake_w, b"x")
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        with self._lock, self._wake_lock:
            self._notes.close()
            for fd in (self._wake_r, self._wake_w):
                if fd is not None:
                    os.close(fd)
            self._wake_r = self._wake_w = None
            self._close_file()

    @property
    def current_path(self) -> str | None:
        """The file being followed now, if any."""
        if self._fd is None:
            return None
        return os.path.join(self._where.dir, self._name)

    # --- the watcher thread --------------------------------------------------------------

    def _run(self) -> None:
        poller = select.poll()  # not select(): it fails outright on descriptors past 1023
        assert self._wake_r is not None
        poller.register(self._wake_r, select.POLLIN)
        if self._notes.inotify is not None:
            poller.register(self._notes.inotify.fileno(), select.POLLIN)
        resting = select.poll()  # the wake-up alone: close() is heard while a count rests
        resting.register(self._wake_r, select.POLLIN)
        pace_ms = 0 if self.options.gives_phase() else COUNT_PACE_S * 1000
        while not self._stopping:
            try:
                rescan = self._wait(poller, resting)
            except (OSError, ValueError) as exc:
                if self._stopping:
                    return  # descriptors closed under us by close()
                log.warning(
                    "%s source %s: file notifications failed (%s); checking every %.2f s",
                    self.kind,
                    self._where.pattern,
                    exc,
                    POLL_INTERVAL_S,
                )
                self._notes.drop(poller)
                rescan = True
            if self._stopping:
                return
            if rescan is None:
                continue  # events about other files in the directory
            try:
                with self._lock:
                    if self._stopping:
                        return
                    changed = self._poll(rescan=rescan)
            except Exception as exc:  # never let the watcher die: the daemon would lose its source
                log.exception("%s source %s: unexpected error", self.kind, self._where.pattern)
                with self._lock:
                    # Fail safe: a source that cannot be read must not look readable.
                    self._set_unreadable(Problem(f"error while reading {self._where.pattern}: {exc!r}"))
                    changed = self._publish()
            callback = self._on_change
            if changed is not None and callback is not None:
                try:
                    callback(changed)
                except Exception:
                    log.exception("%s source %s: on_change failed", self.kind, self._where.pattern)
            if pace_ms and self._notes.active:
                resting.poll(pace_ms)  # what is written meanwhile waits, and is read in one go

    def _wait(self, poller: select.poll, resting: select.poll) -> bool | None:
        """Wait for news: True to look at the path again, False to read the open file
        only, None when nothing concerns this source.  ``resting`` hears the wake-up alone:
        what it waits on while the file is watched elsewhere."""
        if self._notes.kqueue is not None:
            return self._wait_kqueue(self._notes.kqueue)
        ino = self._notes.inotify
        # looked at first: a phase line's wake-up comes back here on its way to the next
        if self._notes.stale and self._ensure_watches():
            return True  # a directory watched only now may already hold the file
        watching = ino is not None and bool(self._notes.watches)
        # a file renamed away is looked at often until something replaces it or its grace ends:
        # no notification says that the grace is over
        interval = SAFETY_INTERVAL_S if watching and self._gone_since is None else POLL_INTERVAL_S
        left = self._last_full + interval - time.monotonic()
        elsewhere = self._elsewhere
        waiting = resting if elsewhere else poller
        ready = {fd for fd, _ in waiting.poll(max(0.0, left) * 1000)} if left > 0 else set()
        if self._wake_r in ready:
            os.read(self._wake_r, 64)  # closing, or no longer watched elsewhere: a full check now
        elif ino is not None and ino.fileno() in ready:
            relevant, rescan = self._sort_events(ino.read_events())
            if relevant or time.monotonic() - self._last_full < interval:
                return rescan if relevant else None
        if elsewhere and ino is not None:
            # what queued meanwhile, each renaming followed, so that the queue stays short
            self._sort_events(ino.read_events())
        # the interval passed, even while other files kept the directory busy (or close()
        # woke us): a full check
        self._last_full = time.monotonic()
        return True

    def _wait_kqueue(self, kq: Kqueue) -> bool:
        """Any news from kqueue means a full check."""
        self._notes.watch_kqueue(kq, self._where, self._fd, self._name)
        kq.wait(SAFETY_INTERVAL_S if not self._notes.stale else POLL_INTERVAL_S)
        return True

    def _ensure_watches(self) -> bool:
        ino = self._notes.inotify
        settled = self._gone_since is None
        return ino is not None and self._notes.ensure(ino, self._where, self._fd, self._name, settled)

    def _sort_events(self, events: list[inotify.Event]) -> tuple[bool, bool]:
        """(does any event concern our file, must the path be resolved again)."""
        relevant, rescan, self._name = self._notes.sort(events, self._where, self._name, self._target_name)
        return relevant, rescan

    # --- reading (under self._lock) ------------------------------------------------------

    def _poll(self, rescan: bool) -> SourceState | None:
        """Read what is new; returns the new state when it changed, else None."""
        if self._fd is not None:
            self._drain()
        if rescan or self._fd is None:
            self._follow_path()
        return self._publish()

    def _follow_path(self) -> None:
        found = self._where.resolve(self._fd, self._name, self._ident, self._positions)
        if isinstance(found, Problem):
            # Nothing at the path: keep a file that was renamed away (rotation in progress:
            # its writer may still write to it, and the new file comes next).
            if found.missing and self._fd is not None and os.fstat(self._fd).st_nlink > 0:
                now = time.monotonic()
                self._gone_since = self._gone_since or now
                if now - self._gone_since < ROTATION_GRACE_S:
                    self._set_readable()
                    return
                found = Problem(
                    f"{found.why}; the file that was there was renamed {now - self._gone_since:.0f}s ago and "
                    "nothing replaced it",
                    missing=True,
                )
            self._close_file()
            self._set_unreadable(found)
            if found.missing:
                self._skip_history = False  # whatever appears at the path from now on is new
            return
        name, st = found
        ident = (st.st_dev, st.st_ino)
        if self._fd is not None and ident == self._ident:
            self._name = name
            self._gone_since = None
            self._set_readable()
            return
        if self._fd is not None:
            self._drain()  # finish the old file before the new one
            self._close_file()
        self._open(name)

    def _open(self, name: str) -> None:
        path = os.path.join(self._where.dir, name)
        try:
            # checked before it is opened for reading: a FIFO or a device swapped in after
            # the stat is never opened (a FIFO's open blocks, a device's may act)
            fd, st = open_regular(path)
        except NotRegularFile:
            self._set_unreadable(Problem(f"{path} is not a regular file"))
            return
        except FileNotFoundError:
            self._set_unreadable(self._where.missing(path))
            return
        except PermissionError:
            self._set_unreadable(self._where.denied(path))
            return
        except OSError as exc:
            self._set_unreadable(Problem(f"cannot open {path}: {exc.strerror or exc}"))
            return
        self._fd, self._name = fd, name
        self._target_name = os.path.basename(os.path.realpath(path))
        self._gone_since = None
        self._ident = (st.st_dev, st.st_ino)
        self._notes.stale = True
        self._lines.reset()
        self._tail = b""
        if self._skip_history:
            # The file was there when the source opened: its phase is the last one it
            # records, and only lines written from now on count as progress.
            self._pos = end_of_last_line(fd, st.st_size, self.splits_cr)
            self._tail = read_tail(fd, self._pos)
            ends = (b"\n", b"\r") if self.splits_cr else (b"\n",)
            if self._pos == st.st_size and self._pos > 0 and self._tail[-1:] not in ends:
                # the last line has no end within a line's length: the rest of it, when it
                # comes, is no line of ours (counted once, as a line too long)
                self._lines.inside_long_line()
                self.malformed += 1
            if self._phase is not None:
                phase = self._last_phase(fd, self._pos)
                if phase is not None:
                    self._phase = phase
        else:
            pos, tail = self._positions.pop(self._ident, (0, b""))
            if pos <= st.st_size and read_tail(fd, pos, len(tail)) == tail:
                self._pos, self._tail = pos, tail
            else:
                self._pos = 0
        self._skip_history = False
        self._set_readable()
        if not self._runaway(fd, st.st_size):
            self._drain()

    def _close_file(self) -> None:
        if self._fd is None:
            return
        if self._ident is not None:
            self._positions[self._ident] = (self._pos, self._tail)
            while len(self._positions) > _REMEMBERED_FILES:
                del self._positions[next(iter(self._positions))]
        self._notes.file_closed()
        os.close(self._fd)
        self._fd, self._ident, self._tail = None, None, b""
        self._lines.reset()

    def _runaway(self, fd: int, size: int) -> bool:
        """Whether the file holds more than one pass's worth past where it was read: then it
        is closed (its place remembered) and unreadable; it is looked at again, without being
        read, on the next check of the path."""
        if size - self._pos <= MAX_PASS_BYTES:
            return False
        path = os.path.join(self._where.dir, self._name)
        self._close_file()
        self._set_unreadable(
            Problem(
                f"{path} grew by {size - self._pos} bytes since it was last read, more than {MAX_PASS_BYTES} "
                "(a sparse or runaway file): not read, and unreadable until it is truncated or replaced"
            )
        )
        return True

    def _drain(self) -> None:
        fd = self._fd
        assert fd is not None
        taken = 0
        try:
            while True:
                if taken >= MAX_PASS_BYTES:
                    self._runaway(fd, os.fstat(fd).st_size)
                    return  # one pass at most: the next wake-up goes on, if the file is sane
                # One read from just before where we were: those bytes must still be the ones
                # read last (else the file was truncated or rewritten in place), and what
                # follows them is new.  Each system call here lets the interpreter lock go
                # and, under load, waits to take it back: so a wake makes one read, not several.
                back = len(self._tail)
                data = os.pread(fd, back + CHUNK, self._pos - back)
                if data[:back] != self._tail or (not back and self._pos and os.fstat(fd).st_size < self._pos):
                    # Truncated (copytruncate, or the program started over), perhaps already
                    # written past where we were: read from the top.
                    self._pos, self._tail = 0, b""
                    self._lines.reset()
                    continue
                chunk = data[back:]
                taken += len(chunk)
                if chunk:
                    self._pos += len(chunk)
                    self._tail = data[-TAIL_BYTES:]
                    self._feed(chunk)
                if len(chunk) < CHUNK:
                    return  # the end for now: a later write is heard anew
        except OSError as exc:
            path = os.path.join(self._where.dir, self._name)
            self._close_file()
            self._set_unreadable(Problem(f"cannot read {path}: {exc.strerror or exc}"))

    # --- state ---------------------------------------------------------------------------

    def _set_readable(self) -> None:
        self._readable, self._why, self._needs_helper = True, "", False

    def _set_unreadable(self, problem: Problem) -> None:
        self._readable, self._why, self._needs_helper = False, problem.why, problem.needs_helper

    def _publish(self) -> SourceState | None:
        prev = self._state
        if (
            prev.readable == self._readable
            and prev.count == self._count
            and prev.phase == self._phase
            and prev.why == self._why
            and prev.needs_helper == self._needs_helper
        ):
            return None
        self._state = SourceState(
            readable=self._readable,
            count=self._count,
            phase=self._phase,
            why=self._why,
            changed_at=time.monotonic(),
            needs_helper=self._needs_helper,
        )
        return self._state
