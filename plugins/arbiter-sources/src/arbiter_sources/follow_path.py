"""A followed file's ``path`` option (:class:`FollowOptions`), and which file it names now, or
why there is none: the file itself, or with a glob in the last component the newest regular
file that matches (as ``tail -F`` would pick).
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Container
from dataclasses import dataclass

from pydantic import Field, field_validator

from arbiter.plugin import KindOptions

GLOB_CHARS = frozenset("*?[")


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
        if GLOB_CHARS & set(os.path.dirname(expanded)):
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


@dataclass(frozen=True)
class Problem:
    """Why there is no file to read."""

    why: str
    missing: bool = False  # nothing there (yet): whatever appears later is new
    needs_helper: bool = False  # there, but this account may not read it


@dataclass(frozen=True)
class FollowedPath:
    """A source's ``path``: as written, expanded (``pattern``), and split into its folder and
    its last component (``base``), which may be a glob."""

    written: str
    pattern: str
    dir: str
    base: str
    is_glob: bool

    @classmethod
    def of(cls, written: str) -> FollowedPath:
        pattern = os.path.expanduser(written)
        folder, base = os.path.split(pattern)
        return cls(written, pattern, folder, base, bool(GLOB_CHARS & set(base)))

    def matches(self, name: str) -> bool:
        """Whether a file of this name in :attr:`dir` is one the path names."""
        return fnmatch.fnmatchcase(name, self.base) if self.is_glob else name == self.base

    def resolve(
        self, fd: int | None, name: str, ident: tuple[int, int] | None, followed_before: Container[tuple[int, int]]
    ) -> tuple[str, os.stat_result] | Problem:
        """(name, stat) of the file to follow, or why there is none.  ``fd``, ``name`` and
        ``ident`` are the file followed now (``fd`` None: none); ``followed_before`` holds the
        (device, inode) of files followed earlier."""
        if not self.is_glob:
            return self._plain()
        best: tuple[int, str, os.stat_result] | None = None
        try:
            with os.scandir(self.dir) as entries:
                for entry in entries:
                    if entry.name.startswith(".") and not self.base.startswith("."):
                        continue  # as glob does: hidden files need a pattern that says so
                    if not fnmatch.fnmatchcase(entry.name, self.base):
                        continue
                    try:
                        st = entry.stat()
                    except OSError:
                        continue
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    key = (st.st_mtime_ns, entry.name, st)
                    if best is None or key[:2] > best[:2]:
                        best = key
        except FileNotFoundError:
            return Problem(
                f"{self.dir} does not exist yet (the newest file matching {self.base} is read once it appears)",
                missing=True,
            )
        except NotADirectoryError:
            return Problem(f"{self.dir} is not a directory")
        except PermissionError:
            return self.denied(self.dir)
        if best is None:
            return Problem(
                f"no file matches {self.pattern} yet (the newest match is read as soon as one appears)", missing=True
            )
        mtime_ns, newest, st = best
        if fd is not None and (st.st_dev, st.st_ino) != ident and fnmatch.fnmatchcase(name, self.base):
            # File times are a clock tick coarse: a file never followed before wins a tie
            # (a new run's file, created just after the last write to the old one), while
            # one followed before must be strictly newer, so two files written in turn
            # do not make the source flap between them.
            try:
                cur = os.fstat(fd)
                if os.path.exists(os.path.join(self.dir, name)) and (
                    cur.st_mtime_ns > mtime_ns
                    or (cur.st_mtime_ns == mtime_ns and (st.st_dev, st.st_ino) in followed_before)
                ):
                    return name, cur
            except OSError:
                pass
        return newest, st

    def _plain(self) -> tuple[str, os.stat_result] | Problem:
        path = self.pattern
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return self.missing(path)
        except NotADirectoryError:
            return Problem(f"{self.dir} is not a directory")
        except PermissionError:
            return self.denied(path)
        except OSError as exc:
            return Problem(f"cannot read {path}: {exc.strerror or exc}")
        if stat.S_ISDIR(st.st_mode):
            return Problem(f"{path} is a directory, not a file")
        if not stat.S_ISREG(st.st_mode):
            return Problem(f"{path} is not a regular file")
        return self.base, st

    def missing(self, path: str) -> Problem:
        """Why ``path`` (this one, or a match of it) cannot be read: it is not there yet."""
        if not os.path.isdir(self.dir):
            why = f"{self.dir} does not exist yet ({path} is read as soon as it appears)"
        else:
            why = f"{path} does not exist yet (it is read as soon as it appears)"
        if self.written.startswith("~"):
            why += f"; ~ is {os.path.expanduser('~')} here: for a user's home, run `arbiter helper` in their session"
        return Problem(why, missing=True)

    @staticmethod
    def denied(path: str) -> Problem:
        """Why ``path`` cannot be read: this account may not."""
        return Problem(
            f"{path}: permission denied for uid {os.getuid()}; run `arbiter helper` in the session "
            "of the user who owns it, or make it readable to the daemon",
            needs_helper=True,
        )
