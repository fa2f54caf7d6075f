"""Following a file a protected program appends to, as ``tail -F`` does.

A glob in the last path component follows the newest match; renames and truncation are
followed; partial lines wait for their newline (or, where the subclass says so, a carriage
return: a progress bar rewrites one line with ``\r``).  Changes are seen through inotify on
Linux and kqueue on macOS and the BSDs (a line reaches ``on_change`` within a millisecond),
and by checking every 250 ms elsewhere.  A source that only counts lines reads at most
every 10 ms (:data:`COUNT_PACE_S`); one that gives a phase reads at every write.
Subclasses say what a line means.

It runs past 500 lines because following one file (globs, renames, truncation, partial
lines, and the three ways of being woken) is one state machine over one open file; what a
line means is in the subclasses' modules.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import select
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ClassVar, Literal

from pydantic import Field, field_validator

from arbiter.plugin import KindOptions, PluginContext, PluginError, Source, SourceState
from arbiter_sources import inotify
from arbiter_sources.kqueue import Kqueue
from arbiter_sources.safeopen import NotRegularFile, open_regular

log = logging.getLogger(__name__)

Phase = Literal["on", "off", "soon"]
#: what a line says: None when it is malformed, else (does it match, the phase it sets)
LineMeaning = tuple[bool, Phase | None] | None

_GLOB_CHARS = frozenset("*?[")
#: a line longer than this is malformed; it is dropped rather than buffered without end
MAX_LINE_BYTES = 1 << 20
_CHUNK = 1 << 16
#: check interval without file notifications
POLL_INTERVAL_S = 0.25
#: with notifications, a check this often anyway, in case an event was missed
SAFETY_INTERVAL_S = 1.0
#: how long a file renamed away is still followed while nothing replaces it (its writer
#: may write a last line before it reopens the path)
ROTATION_GRACE_S = 10.0
#: how much of what was read is compared again before each read, to notice a rewrite
_TAIL_BYTES = 256
#: a source that only counts lines (it gives no phase) reads at most this often while
#: file notifications wake it: the count becomes a rate over seconds, and a program that
#: writes two hundred times a second otherwise wakes this thread, and the daemon's decision
#: thread with each report, as often, each time taking the interpreter from the fast path.
#: A rate taken between two reads misses what came since the last: over a 5 s window, 0.1 %
#: on average and 0.2 % at most; a program that writes a hundred times a second or less is
#: read at every write, as before
COUNT_PACE_S = 0.01
#: positions remembered for files followed before (a glob may switch back to one)
_REMEMBERED_FILES = 16


@dataclass(frozen=True)
class _Problem:
    """Why there is no file to read."""

    why: str
    missing: bool = False  # nothing there (yet): whatever appears later is new
    needs_helper: bool = False  # there, but this account may not read it


class FollowOptions(KindOptions):
    """Options every followed file has: its path (the last component may be a glob)."""

    path: str = Field(
        description="the file, absolute or starting with ~; its last component may be a glob, whose newest match is followed"
    )

    @field_validator("path")
    @classmethod
    def _path_shape(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("path must name a file")
        expanded = os.path.expanduser(value)
        if not os.path.isabs(expanded):
            raise ValueError(f"path must be absolute or start with ~ (got {value!r})")
        if _GLOB_CHARS & set(os.path.dirname(expanded)):
            raise ValueError(f"only the last component of path may be a pattern (got {value!r})")
        if not os.path.basename(expanded):
            raise ValueError(f"path must name a file, not a directory (got {value!r})")
        return value

    def gives_phase(self) -> bool:
        return False

    def needs_trusted_file(self) -> str | None:
        # a pattern matched on a file the daemon may read and the rule's writer may not
        # would tell that writer what the file holds, one match at a time
        return "reads a file with the daemon's rights"


class FollowedFile(Source):
    """Follows one file (or the newest file a glob matches) and counts the lines that match."""

    kind = "file"
    Options: ClassVar[type[FollowOptions]] = FollowOptions
    #: a carriage return ends a line too (progress bars redraw one line with ``\r``)
    splits_cr: ClassVar[bool] = False

    def __init__(self, options: FollowOptions, context: PluginContext) -> None:
        super().__init__(options, context)
        self.options: FollowOptions = options
        self._pattern = os.path.expanduser(options.path)
        self._dir, self._base = os.path.split(self._pattern)
        self._is_glob = bool(_GLOB_CHARS & set(self._base))
        self._history_needles: tuple[bytes, ...] = ()

        #: lines that did not parse (or were too long), skipped
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
        self._partial = b""
        self._tail = b""  # the bytes just before _pos, to notice the file rewritten in place
        self._discarding = False  # inside a line too long to keep
        self._skip_history = True  # until the first poll finds the file missing
        self._positions: dict[tuple[int, int], tuple[int, bytes]] = {}  # ident -> (pos, tail)

        self._lock = threading.Lock()
        self._on_change: Callable[[SourceState], None] | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._wake_r: int | None = None
        self._wake_w: int | None = None
        self._inotify: inotify.Inotify | None = None
        self._kqueue: Kqueue | None = None
        self._watches: dict[int, str] = {}  # wd → the directory, or the followed file's /proc/self/fd path
        self._file_wd: int | None = None  # the watch on the followed file itself
        self._watches_stale = True  # the directories to watch may have changed
        self._closed = False
        self._moving: dict[int, str] = {}  # rename cookie -> old name of our file
        self._target_name = ""  # the followed file's own name where the path is a symlink
        self._last_full = 0.0  # monotonic time of the last full check
        self._gone_since: float | None = None  # the path lost its file while we kept it open

    def match_line(self, line: bytes) -> LineMeaning:
        """What one complete, stripped, non-empty line means."""
        raise NotImplementedError

    def units(self) -> int:
        """How much progress the line ``match_line`` just matched is worth (one, unless the
        line carries its own count)."""
        return 1

    # --- the Source API ------------------------------------------------------------------

    def start(self, on_change: Callable[[SourceState], None]) -> None:
        """Read the file once (state() is current when this returns), then watch it."""
        with self._lock:
            if self._closed:
                raise PluginError(f"the {self.kind} source for {self._pattern} was closed; create a new one")
            self._on_change = on_change
            if self._thread is not None:
                return
            self._stopping = False
            self._wake_r, self._wake_w = os.pipe()
            try:
                if Kqueue.supported():
                    self._kqueue = Kqueue(self._wake_r)
                else:
                    self._inotify = inotify.Inotify()
            except OSError as exc:
                log.info(
                    "%s source %s: no file notifications (%s); checking every %.2f s",
                    self.kind,
                    self._pattern,
                    exc,
                    POLL_INTERVAL_S,
                )
                self._inotify = None
            # Watch before the first read, so no write falls between the two unseen.
            if self._inotify is not None:
                self._ensure_watches(self._inotify)
            self._poll(rescan=True)
            if self._inotify is not None:
                self._ensure_watches(self._inotify)
            self._thread = threading.Thread(target=self._run, name=f"arbiter-{self.kind}:{self._pattern}", daemon=True)
            self._thread.start()

    def state(self) -> SourceState:
        if self._thread is None and not self._closed:
            # Not watched: read now, so a caller on a tick still gets news.
            with self._lock:
                if self._thread is None and not self._closed:
                    self._poll(rescan=True)
        return self._state

    def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
            self._stopping = self._closed = True
            if self._wake_w is not None:
                os.write(self._wake_w, b"x")
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        with self._lock:
            if self._inotify is not None:
                self._inotify.close()
                self._inotify = None
            if self._kqueue is not None:
                self._kqueue.close()
                self._kqueue = None
            self._watches.clear()
            self._file_wd = None
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
        return os.path.join(self._dir, self._name)

    # --- the watcher thread --------------------------------------------------------------

    def _run(self) -> None:
        poller = select.poll()  # not select(): it fails outright on descriptors past 1023
        assert self._wake_r is not None
        poller.register(self._wake_r, select.POLLIN)
        if self._inotify is not None:
            poller.register(self._inotify.fileno(), select.POLLIN)
        resting = select.poll()  # the wake-up alone: close() is heard while a count rests
        resting.register(self._wake_r, select.POLLIN)
        pace_ms = 0 if self.options.gives_phase() else COUNT_PACE_S * 1000
        while not self._stopping:
            try:
                rescan = self._wait(poller)
            except (OSError, ValueError) as exc:
                if self._stopping:
                    return  # descriptors closed under us by close()
                log.warning(
                    "%s source %s: file notifications failed (%s); checking every %.2f s",
                    self.kind,
                    self._pattern,
                    exc,
                    POLL_INTERVAL_S,
                )
                self._drop_inotify(poller)
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
                log.exception("%s source %s: unexpected error", self.kind, self._pattern)
                with self._lock:
                    # Fail safe: a source that cannot be read must not look readable.
                    self._set_unreadable(_Problem(f"error while reading {self._pattern}: {exc!r}"))
                    changed = self._publish()
            callback = self._on_change
            if changed is not None and callback is not None:
                try:
                    callback(changed)
                except Exception:
                    log.exception("%s source %s: on_change failed", self.kind, self._pattern)
            if pace_ms and (self._inotify is not None or self._kqueue is not None):
                resting.poll(pace_ms)  # what is written meanwhile waits, and is read in one go

    def _wait(self, poller: select.poll) -> bool | None:
        """Wait for news: True to look at the path again, False to read the open file
        only, None when nothing concerns this source."""
        if self._kqueue is not None:
            return self._wait_kqueue(self._kqueue)
        ino = self._inotify
        if ino is not None and self._ensure_watches(ino):
            return True  # a directory watched only now may already hold the file
        watching = ino is not None and bool(self._watches)
        interval = SAFETY_INTERVAL_S if watching else POLL_INTERVAL_S
        left = self._last_full + interval - time.monotonic()
        ready = {fd for fd, _ in poller.poll(max(0.0, left) * 1000)} if left > 0 else set()
        if ino is not None and ino.fileno() in ready:
            relevant, rescan = self._sort_events(ino.read_events())
            if relevant or time.monotonic() - self._last_full < interval:
                return rescan if relevant else None
        # the interval passed, even while other files kept the directory busy (or close()
        # woke us): a full check
        self._last_full = time.monotonic()
        return True

    def _wait_kqueue(self, kq: Kqueue) -> bool:
        """kqueue watches descriptors, not names: the directory (a file came or went) and
        the file followed (written, renamed, deleted).  Any news means a full check."""
        if self._watches_stale:
            wanted = [self._dir]
            if self._fd is not None:
                wanted.append(os.path.dirname(os.path.realpath(os.path.join(self._dir, self._name))))
            self._watches_stale = not kq.watch(wanted, self._fd)
        kq.wait(SAFETY_INTERVAL_S if not self._watches_stale else POLL_INTERVAL_S)
        return True

    def _drop_inotify(self, poller: select.poll) -> None:
        if self._kqueue is not None:
            self._kqueue.close()
            self._kqueue = None
        ino, self._inotify = self._inotify, None
        self._watches.clear()
        self._file_wd = None
        if ino is not None:
            try:
                poller.unregister(ino.fileno())
            except (KeyError, ValueError):
                pass
            ino.close()

    def _ensure_watches(self, ino: inotify.Inotify) -> bool:
        """Watch the directories that hold the file, and the file itself; True when one was
        added.  Writes to a named file are heard on the file, not its directory: a watch on
        the directory wakes for every write to every file there, and twenty sources in one
        directory beside a log written two hundred times a second cost a core between them."""
        if not self._watches_stale:
            return False
        directory_events = inotify.DIRECTORY_EVENTS
        if not self._is_glob:  # a write to another match may make it the newest: globs hear them all
            directory_events &= ~(inotify.IN_MODIFY | inotify.IN_CLOSE_WRITE)
        wanted = {self._dir}
        if self._fd is not None:
            real = os.path.dirname(os.path.realpath(os.path.join(self._dir, self._name)))
            wanted.add(real)  # a symlinked file is renamed or replaced in its target's directory
            if not self._is_glob:
                wanted.add(f"/proc/self/fd/{self._fd}")  # the descriptor: the path may already name the next file
        have = set(self._watches.values())
        added = False
        for path in wanted - have:
            is_file = path.startswith("/proc/self/fd/")
            try:
                if is_file:
                    wd = ino.add_watch(path, inotify.FILE_EVENTS)
                else:
                    wd = ino.add_watch(path, directory_events | inotify.IN_ONLYDIR)
            except OSError:
                continue  # missing or unreadable directory: checked on the interval instead
            self._watches[wd] = path
            if is_file:
                self._file_wd = wd
            added = True
        for wd, path in list(self._watches.items()):
            if path not in wanted:
                ino.rm_watch(wd)
                del self._watches[wd]
                if wd == self._file_wd:
                    self._file_wd = None
        # Retried on every interval until each directory is watched.
        self._watches_stale = set(self._watches.values()) != wanted
        return added

    def _sort_events(self, events: list[inotify.Event]) -> tuple[bool, bool]:
        """(does any event concern our file, must the path be resolved again)."""
        relevant = rescan = False
        for ev in events:
            if ev.mask & (inotify.IN_IGNORED | inotify.IN_Q_OVERFLOW | inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF):
                if ev.mask & inotify.IN_MOVE_SELF and self._inotify is not None and ev.wd in self._watches:
                    # The directory moved away: its path must be watched anew.
                    self._inotify.rm_watch(ev.wd)
                if ev.mask & (inotify.IN_IGNORED | inotify.IN_MOVE_SELF):
                    self._watches.pop(ev.wd, None)
                    self._watches_stale = True
                    if ev.wd == self._file_wd:
                        self._file_wd = None
                relevant = rescan = True
                continue
            if ev.wd == self._file_wd:
                relevant = True  # written: the open file is read, the path need not be looked at
                continue
            # a symlinked file's writes are reported under its target's name
            ours = bool(self._name) and ev.name in (self._name, self._target_name)
            if ev.mask & inotify.IN_MOVED_FROM and ours:
                self._moving[ev.cookie] = ev.name
            if ev.mask & inotify.IN_MOVED_TO and ev.cookie in self._moving:
                del self._moving[ev.cookie]
                self._name = ev.name  # our file, renamed: keep hearing its writes
                ours = True
            matches = fnmatch.fnmatchcase(ev.name, self._base) if self._is_glob else ev.name == self._base
            if not (ours or matches):
                continue
            relevant = True
            # A write to the file we follow needs no new look at the path; anything else may.
            if not (ours and ev.mask & (inotify.IN_MODIFY | inotify.IN_CLOSE_WRITE)):
                rescan = True
        if len(self._moving) > 64:
            self._moving.clear()  # renames whose other half never came
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
        found = self._resolve()
        if isinstance(found, _Problem):
            # Nothing at the path: keep a file that was renamed away (rotation in progress:
            # its writer may still write to it, and the new file comes next).
            if found.missing and self._fd is not None and os.fstat(self._fd).st_nlink > 0:
                now = time.monotonic()
                self._gone_since = self._gone_since or now
                if now - self._gone_since < ROTATION_GRACE_S:
                    self._set_readable()
                    return
                found = _Problem(
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

    def _resolve(self) -> tuple[str, os.stat_result] | _Problem:
        """(name, stat) of the file to follow, or why there is none."""
        if not self._is_glob:
            path = self._pattern
            try:
                st = os.stat(path)
            except FileNotFoundError:
                return self._missing(path)
            except NotADirectoryError:
                return _Problem(f"{self._dir} is not a directory")
            except PermissionError:
                return self._denied(path)
            except OSError as exc:
                return _Problem(f"cannot read {path}: {exc.strerror or exc}")
            if stat.S_ISDIR(st.st_mode):
                return _Problem(f"{path} is a directory, not a file")
            if not stat.S_ISREG(st.st_mode):
                return _Problem(f"{path} is not a regular file")
            return self._base, st
        best: tuple[int, str, os.stat_result] | None = None
        try:
            with os.scandir(self._dir) as entries:
                for entry in entries:
                    name = entry.name
                    if name.startswith(".") and not self._base.startswith("."):
                        continue  # as glob does: hidden files need a pattern that says so
                    if not fnmatch.fnmatchcase(name, self._base):
                        continue
                    try:
                        st = entry.stat()
                    except OSError:
                        continue
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    key = (st.st_mtime_ns, name, st)
                    if best is None or key[:2] > best[:2]:
                        best = key
        except FileNotFoundError:
            return _Problem(
                f"{self._dir} does not exist yet (the newest file matching {self._base} is read once it appears)",
                missing=True,
            )
        except NotADirectoryError:
            return _Problem(f"{self._dir} is not a directory")
        except PermissionError:
            return self._denied(self._dir)
        if best is None:
            return _Problem(
                f"no file matches {self._pattern} yet (the newest match is read as soon as one appears)", missing=True
            )
        mtime_ns, name, st = best
        ident = (st.st_dev, st.st_ino)
        if self._fd is not None and ident != self._ident and fnmatch.fnmatchcase(self._name, self._base):
            # File times are a clock tick coarse: a file never followed before wins a tie
            # (a new run's file, created just after the last write to the old one), while
            # one followed before must be strictly newer, so two files written in turn
            # do not make the source flap between them.
            try:
                cur = os.fstat(self._fd)
                if os.path.exists(os.path.join(self._dir, self._name)) and (
                    cur.st_mtime_ns > mtime_ns or (cur.st_mtime_ns == mtime_ns and ident in self._positions)
                ):
                    return self._name, cur
            except OSError:
                pass
        return name, st

    def _missing(self, path: str) -> _Problem:
        if not os.path.isdir(self._dir):
            why = f"{self._dir} does not exist yet ({path} is read as soon as it appears)"
        else:
            why = f"{path} does not exist yet (it is read as soon as it appears)"
        if self.options.path.startswith("~"):
            why += f"; ~ is {os.path.expanduser('~')} here: for a user's home, run `arbiter helper` in their session"
        return _Problem(why, missing=True)

    @staticmethod
    def _denied(path: str) -> _Problem:
        return _Problem(
            f"{path}: permission denied for uid {os.getuid()}; run `arbiter helper` in the session "
            "of the user who owns it, or make it readable to the daemon",
            needs_helper=True,
        )

    def _open(self, name: str) -> None:
        path = os.path.join(self._dir, name)
        try:
            # checked before it is opened for reading: a FIFO or a device swapped in after
            # the stat is never opened (a FIFO's open blocks, a device's may act)
            fd, st = open_regular(path)
        except NotRegularFile:
            self._set_unreadable(_Problem(f"{path} is not a regular file"))
            return
        except FileNotFoundError:
            self._set_unreadable(self._missing(path))
            return
        except PermissionError:
            self._set_unreadable(self._denied(path))
            return
        except OSError as exc:
            self._set_unreadable(_Problem(f"cannot open {path}: {exc.strerror or exc}"))
            return
        self._fd, self._name = fd, name
        self._target_name = os.path.basename(os.path.realpath(path))
        self._gone_since = None
        self._ident = (st.st_dev, st.st_ino)
        self._watches_stale = True
        self._partial, self._tail, self._discarding = b"", b"", False
        if self._skip_history:
            # The file was there when the source opened: its phase is the last one it
            # records, and only lines written from now on count as progress.
            self._pos = _end_of_last_line(fd, st.st_size, self.splits_cr)
            self._tail = _read_tail(fd, self._pos)
            if self._phase is not None:
                phase = self._last_phase(fd, self._pos)
                if phase is not None:
                    self._phase = phase
        else:
            pos, tail = self._positions.pop(self._ident, (0, b""))
            if pos <= st.st_size and _read_tail(fd, pos, len(tail)) == tail:
                self._pos, self._tail = pos, tail
            else:
                self._pos = 0
        self._skip_history = False
        self._set_readable()
        self._drain()

    def _close_file(self) -> None:
        if self._fd is None:
            return
        if self._ident is not None:
            self._positions[self._ident] = (self._pos, self._tail)
            while len(self._positions) > _REMEMBERED_FILES:
                del self._positions[next(iter(self._positions))]
        if self._file_wd is not None and self._inotify is not None:
            # the next file may get the same descriptor number, and so the same watch path
            self._inotify.rm_watch(self._file_wd)
            self._watches.pop(self._file_wd, None)
            self._file_wd = None
        os.close(self._fd)
        self._fd, self._ident, self._partial, self._tail, self._discarding = None, None, b"", b"", False
        self._watches_stale = True

    def _drain(self) -> None:
        fd = self._fd
        assert fd is not None
        try:
            while True:
                # One read from just before where we were: those bytes must still be the ones
                # read last (else the file was truncated or rewritten in place), and what
                # follows them is new.  Each system call here lets the interpreter lock go
                # and, under load, waits to take it back: so a wake makes one read, not several.
                back = len(self._tail)
                data = os.pread(fd, back + _CHUNK, self._pos - back)
                if data[:back] != self._tail or (not back and self._pos and os.fstat(fd).st_size < self._pos):
                    # Truncated (copytruncate, or the program started over), perhaps already
                    # written past where we were: read from the top.
                    self._pos, self._partial, self._tail, self._discarding = 0, b"", b"", False
                    continue
                chunk = data[back:]
                if chunk:
                    self._pos += len(chunk)
                    self._tail = data[-_TAIL_BYTES:]
                    self._feed(chunk)
                if len(chunk) < _CHUNK:
                    return  # the end for now: a later write is heard anew
        except OSError as exc:
            path = os.path.join(self._dir, self._name)
            self._close_file()
            self._set_unreadable(_Problem(f"cannot read {path}: {exc.strerror or exc}"))

    def _feed(self, chunk: bytes) -> None:
        if self.splits_cr:
            chunk = chunk.replace(b"\r", b"\n")  # "\r\n" leaves an empty line, which is skipped
        if self._discarding:
            end = chunk.find(b"\n")
            if end < 0:
                return
            chunk, self._discarding = chunk[end + 1 :], False
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            self._apply(line)
        if len(self._partial) > MAX_LINE_BYTES:
            self.malformed += 1
            self._partial, self._discarding = b"", True

    def _apply(self, line: bytes) -> None:
        line = line.strip()
        if not line:
            return
        meaning = self.match_line(line)
        if meaning is None:
            self.malformed += 1
            return
        matched, phase = meaning
        if matched:
            self._count += self.units()
            if phase is not None:
                self._phase = phase

    def _last_phase(self, fd: int, end: int) -> Phase | None:
        for line in _lines_backward(fd, end):
            if self._history_needles and not any(n in line for n in self._history_needles):
                continue
            meaning = self.match_line(line.strip())
            if meaning is not None and meaning[0] and meaning[1] is not None:
                return meaning[1]
        return None

    # --- state ---------------------------------------------------------------------------

    def _set_readable(self) -> None:
        self._readable, self._why, self._needs_helper = True, "", False

    def _set_unreadable(self, problem: _Problem) -> None:
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


def _end_of_last_line(fd: int, size: int, cr: bool = False) -> int:
    """The offset just past the file's last newline (or carriage return, with ``cr``; 0
    when it has none)."""
    pos = size
    while pos > 0:
        n = min(_CHUNK, pos)
        pos -= n
        block = os.pread(fd, n, pos)
        at = max(block.rfind(b"\n"), block.rfind(b"\r")) if cr else block.rfind(b"\n")
        if at >= 0:
            return pos + at + 1
    return 0


def _read_tail(fd: int, end: int, length: int = _TAIL_BYTES) -> bytes:
    start = max(0, end - length)
    return os.pread(fd, end - start, start)


def _lines_backward(fd: int, end: int) -> Iterator[bytes]:
    """The complete lines before ``end``, last first."""
    pos = end
    carry = b""
    while pos > 0:
        n = min(_CHUNK, pos)
        pos -= n
        lines = (os.pread(fd, n, pos) + carry).split(b"\n")
        carry = lines[0]
        yield from reversed(lines[1:])
        if len(carry) > MAX_LINE_BYTES:
            carry = b""  # a line too long to be one of ours; its start reads as malformed
    if carry:
        yield carry
