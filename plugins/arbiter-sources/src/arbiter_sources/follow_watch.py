"""The file notifications that wake a followed file's thread: inotify on Linux (watches on the
folders that hold the file and on the file itself), kqueue on macOS and the BSDs; neither
where the system gives none, and the thread then checks on an interval.
"""

from __future__ import annotations

import os
import select

from arbiter_sources import follow_fs, inotify
from arbiter_sources.follow_path import FollowedPath
from arbiter_sources.kqueue import Kqueue


class Notifications:
    """What a followed file is woken by, and which of its watches stand."""

    def __init__(self) -> None:
        self.inotify: inotify.Inotify | None = None
        self.kqueue: Kqueue | None = None
        self.watches: dict[int, str] = {}  # wd → the directory, or the followed file's /proc/self/fd path
        self.file_wd: int | None = None  # the watch on the followed file itself
        self._masks: dict[int, int] = {}  # wd → the events it asks for
        self.stale = True  # the directories to watch may have changed
        self._moving: dict[int, str] = {}  # rename cookie -> old name of our file
        self._remote: tuple[int, bool] | None = None  # (descriptor, is its filesystem remote)

    def open(self, wake_r: int) -> None:
        """Take kqueue (which hears ``wake_r`` too) or inotify; raises OSError where neither is had."""
        if Kqueue.supported():
            self.kqueue = Kqueue(wake_r)
        else:
            self.inotify = inotify.Inotify()

    @property
    def active(self) -> bool:
        return self.inotify is not None or self.kqueue is not None

    def drop(self, poller: select.poll) -> None:
        """Give up notifications (they failed): the thread checks on an interval from now on."""
        if self.kqueue is not None:
            self.kqueue.close()
            self.kqueue = None
        ino, self.inotify = self.inotify, None
        self.watches.clear()
        self.file_wd = None
        if ino is not None:
            try:
                poller.unregister(ino.fileno())
            except (KeyError, ValueError):
                pass
            ino.close()

    def close(self) -> None:
        if self.inotify is not None:
            self.inotify.close()
            self.inotify = None
        if self.kqueue is not None:
            self.kqueue.close()
            self.kqueue = None
        self.watches.clear()
        self.file_wd = None

    def file_closed(self) -> None:
        """The followed file was closed: the next one may get the same descriptor number, and
        so the same watch path."""
        if self.file_wd is not None and self.inotify is not None:
            self.inotify.rm_watch(self.file_wd)
            self.watches.pop(self.file_wd, None)
            self.file_wd = None
        self._remote = None
        self.stale = True

    def remote(self, fd: int) -> bool:
        """Whether the file open at ``fd`` is on a network (or FUSE, or unknown) filesystem:
        looked up once a file opened."""
        if self._remote is None or self._remote[0] != fd:
            self._remote = (fd, follow_fs.is_remote(follow_fs.fd_fs_type(fd)))
        return self._remote[1]

    def watch_kqueue(self, kq: Kqueue, where: FollowedPath, fd: int | None, name: str) -> None:
        """kqueue watches descriptors, not names: the directory (a file came or went) and the
        file followed (written, renamed, deleted)."""
        if self.stale:
            wanted = [where.dir]
            if fd is not None:
                wanted.append(os.path.dirname(os.path.realpath(os.path.join(where.dir, name))))
            self.stale = not kq.watch(wanted, fd)

    def ensure(self, ino: inotify.Inotify, where: FollowedPath, fd: int | None, name: str, settled: bool) -> bool:
        """Watch the directories that hold the file, and the file itself; True when one was
        added.  Writes to a named file are heard on the file, not its directory: a watch on
        the directory wakes for every write to every file there, and twenty sources in one
        directory beside a log written two hundred times a second cost a core between them.

        ``settled``: the file open is the one at the path (not renamed away).  A plain path
        that is no symlink then needs no watch on its directory: nothing new can appear at
        the path before this file leaves it, renamed (the file's own watch hears the move),
        deleted or renamed over (its link count falls: the file's watch hears that as a
        change of attributes), or its directory moved or deleted (a watch on the directory
        for those alone hears it), and the directory is watched for its files again from
        then on.  A file nothing writes then sleeps while other files come and go beside it
        (a program replacing its status file would otherwise wake every such source each
        time).  A file on a network filesystem keeps its directory fully watched: NFS
        renames a file deleted while open to ``.nfsXXXX`` and its watch hears nothing, and
        FUSE sends what its server chooses."""
        if not self.stale:
            return False
        directory_events = inotify.DIRECTORY_EVENTS
        if not where.is_glob:  # a write to another match may make it the newest: globs hear them all
            directory_events &= ~(inotify.IN_MODIFY | inotify.IN_CLOSE_WRITE)
        wanted = {where.dir: directory_events | inotify.IN_ONLYDIR}
        if fd is not None:
            at = os.path.join(where.dir, name)
            real = os.path.realpath(at)
            if settled and not where.is_glob and real == at and not self.remote(fd):
                # the directory renamed away or deleted (a new one may be made in its place)
                wanted[where.dir] = inotify.IN_MOVE_SELF | inotify.IN_DELETE_SELF | inotify.IN_ONLYDIR
            else:
                # a symlinked file is renamed or replaced in its target's directory
                wanted[os.path.dirname(real)] = directory_events | inotify.IN_ONLYDIR
            if not where.is_glob:
                # the descriptor: the path may already name the next file
                wanted[f"/proc/self/fd/{fd}"] = inotify.FILE_EVENTS
        have = {path: wd for wd, path in self.watches.items()}
        added = False
        for path, mask in wanted.items():
            if path in have and self._masks.get(have[path]) == mask:
                continue
            try:
                wd = ino.add_watch(path, mask)  # a watch that stands is given the new mask
            except OSError:
                continue  # missing or unreadable directory: checked on the interval instead
            if have.get(path, wd) != wd:
                ino.rm_watch(have[path])  # the path names another directory now
                del self.watches[have[path]]
            self.watches[wd] = path
            self._masks[wd] = mask
            if path.startswith("/proc/self/fd/"):
                self.file_wd = wd
            added = True
        for wd, path in list(self.watches.items()):
            if path not in wanted:
                ino.rm_watch(wd)
                del self.watches[wd]
                if wd == self.file_wd:
                    self.file_wd = None
        self._masks = {wd: mask for wd, mask in self._masks.items() if wd in self.watches}
        # Retried on every interval until each directory is watched.
        self.stale = set(self.watches.values()) != set(wanted)
        return added

    def sort(
        self, events: list[inotify.Event], where: FollowedPath, name: str, target_name: str
    ) -> tuple[bool, bool, str]:
        """(does any event concern our file, must the path be resolved again, our file's name
        now: ``name``, or the name it was renamed to).  ``target_name`` is the followed file's
        own name where the path is a symlink."""
        relevant = rescan = False
        for ev in events:
            if ev.mask & (inotify.IN_IGNORED | inotify.IN_Q_OVERFLOW | inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF):
                if ev.mask & inotify.IN_MOVE_SELF and self.inotify is not None and ev.wd in self.watches:
                    # The directory moved away: its path must be watched anew.
                    self.inotify.rm_watch(ev.wd)
                if ev.mask & (inotify.IN_IGNORED | inotify.IN_MOVE_SELF):
                    self.watches.pop(ev.wd, None)
                    self.stale = True
                    if ev.wd == self.file_wd:
                        self.file_wd = None
                relevant = rescan = True
                continue
            if ev.wd == self.file_wd:
                relevant = True  # written: the open file is read, the path need not be looked at
                if ev.mask & inotify.IN_ATTRIB:
                    # deleted or renamed over, perhaps: the path is looked at again, and its
                    # directory watched again while the file is not the one there
                    rescan = self.stale = True
                continue
            # a symlinked file's writes are reported under its target's name
            ours = bool(name) and ev.name in (name, target_name)
            if ev.mask & inotify.IN_MOVED_FROM and ours:
                self._moving[ev.cookie] = ev.name
            if ev.mask & inotify.IN_MOVED_TO and ev.cookie in self._moving:
                del self._moving[ev.cookie]
                name = ev.name  # our file, renamed: keep hearing its writes
                ours = True
            if not (ours or where.matches(ev.name)):
                continue
            relevant = True
            # A write to the file we follow needs no new look at the path; anything else may.
            if not (ours and ev.mask & (inotify.IN_MODIFY | inotify.IN_CLOSE_WRITE)):
                rescan = True
        if len(self._moving) > 64:
            self._moving.clear()  # renames whose other half never came
        return relevant, rescan, name
