"""arbiter source kinds read from plain files, for programs that can write a file but not JSON
lines or a log:

- ``flag_file``: a phase that is on while a file exists (``touch`` it when a backup, an
  upload or a render starts, remove it when it ends), and optionally ``soon`` while another
  one exists.
- ``counter_file``: progress a program writes as one number (steps done so far), rewritten
  whole each time.

Both poll (every ``poll_s``) from their own thread and hand each change over at once.  This
distribution is the worked example of docs/plugins.md: it is installed like any third-party
plugin and imports only :mod:`arbiter.plugin` from arbiter.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Literal

from pydantic import Field, field_validator

from arbiter.plugin import KindOptions, PluginContext, Register, Source, SourceState, hookimpl

__all__ = ["CounterFileSource", "FlagFileSource", "arbiter_register_sources"]


def _absolute(value: str) -> str:
    path = os.path.expanduser(value)
    if not os.path.isabs(path):
        # the daemon runs in its own working directory, not the rule author's
        raise ValueError(f"{value!r} is not an absolute path (write it from /, or from ~ for the daemon's home)")
    return path


class FileOptions(KindOptions):
    """What both kinds share."""

    path: str = Field(description="the file, absolute (a leading ~ is the daemon's home)")
    poll_s: float = Field(0.2, gt=0, le=10, description="how often the file is looked at, in seconds")

    @field_validator("path")
    @classmethod
    def _path_is_absolute(cls, value: str) -> str:
        return _absolute(value)


class FlagFileOptions(FileOptions):
    """``{kind: flag_file, path, soon_path?}``: the phase is on while ``path`` exists."""

    kind: Literal["flag_file"] = "flag_file"
    soon_path: str | None = Field(
        None, description="the phase is soon while this file exists and path does not (fleet work gets ready to yield)"
    )

    @field_validator("soon_path")
    @classmethod
    def _soon_is_absolute(cls, value: str | None) -> str | None:
        return None if value is None else _absolute(value)

    def gives_phase(self) -> bool:
        return True  # on while the file exists: during: may use it


class CounterFileOptions(FileOptions):
    """``{kind: counter_file, path}``: the file holds one whole number, the work done so far."""

    kind: Literal["counter_file"] = "counter_file"

    def gives_phase(self) -> bool:
        return False  # a count: protect.source, not during:


class _PolledFile(Source):
    """Polls from its own thread; ``on_change`` gets each new state the moment it is seen."""

    def __init__(self, options: FileOptions, context: PluginContext) -> None:
        super().__init__(options, context)
        self.options: FileOptions = options
        self._state = SourceState(readable=False, why="not read yet")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def read_now(self, previous: SourceState) -> SourceState:
        """The state the file says now; ``changed_at`` is filled in by the caller."""
        raise NotImplementedError

    def start(self, on_change: Callable[[SourceState], None]) -> None:
        self._poll(on_change)  # a first reading before start returns
        self._thread = threading.Thread(
            target=self._run, args=(on_change,), name=f"source {self.options.path}", daemon=True
        )
        self._thread.start()

    def _run(self, on_change: Callable[[SourceState], None]) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.options.poll_s)
            self._wake.clear()
            if not self._stop.is_set():
                self._poll(on_change)

    def _poll(self, on_change: Callable[[SourceState], None]) -> None:
        with self._lock:
            before = self._state
        after = self.read_now(before)
        if (after.readable, after.phase, after.count, after.why) == (
            before.readable,
            before.phase,
            before.count,
            before.why,
        ):
            return
        after = SourceState(
            readable=after.readable,
            count=after.count,
            phase=after.phase,
            why=after.why,
            needs_helper=after.needs_helper,
            changed_at=time.monotonic(),
        )
        with self._lock:
            self._state = after
        on_change(after)

    def state(self) -> SourceState:
        with self._lock:
            return self._state

    def refresh(self) -> None:
        self._wake.set()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _exists(path: str) -> bool | str:
    """Whether ``path`` exists, or why that cannot be told (its folder is missing or closed)."""
    try:
        os.stat(path)
        return True
    except FileNotFoundError:
        folder = os.path.dirname(path)
        return False if os.path.isdir(folder) else f"its folder {folder} does not exist"
    except PermissionError:
        return f"this account may not look into {os.path.dirname(path)}"
    except OSError as exc:
        return f"{path}: {exc.strerror}"


class FlagFileSource(_PolledFile):
    """A phase from the existence of a file (and, for ``soon``, of another)."""

    Options = FlagFileOptions

    def __init__(self, options: FlagFileOptions, context: PluginContext) -> None:
        super().__init__(options, context)
        self.options: FlagFileOptions = options

    def read_now(self, previous: SourceState) -> SourceState:
        on = _exists(self.options.path)
        if isinstance(on, str):
            # unknown counts as on: fleet work waits rather than disturb the program
            return SourceState(readable=False, phase="on", why=on, needs_helper="may not" in on)
        if on:
            return SourceState(phase="on")
        if self.options.soon_path is not None:
            soon = _exists(self.options.soon_path)
            if isinstance(soon, str):
                return SourceState(readable=False, phase="on", why=soon, needs_helper="may not" in soon)
            if soon:
                return SourceState(phase="soon")
        return SourceState(phase="off")


class CounterFileSource(_PolledFile):
    """Progress from a file holding one whole number."""

    Options = CounterFileOptions

    def __init__(self, options: CounterFileOptions, context: PluginContext) -> None:
        super().__init__(options, context)
        self.options: CounterFileOptions = options

    def read_now(self, previous: SourceState) -> SourceState:
        try:
            with open(self.options.path, "rb") as f:
                text = f.read(64).decode("ascii", "replace").strip()
        except FileNotFoundError:
            return SourceState(readable=False, why=f"{self.options.path} does not exist (yet)")
        except PermissionError:
            return SourceState(readable=False, why=f"this account may not read {self.options.path}", needs_helper=True)
        except OSError as exc:
            return SourceState(readable=False, why=f"{self.options.path}: {exc.strerror}")
        if not text:
            # a writer that truncates before it writes leaves the file empty for a moment
            return previous
        if not text.isdigit():
            return SourceState(readable=False, why=f"{self.options.path} holds {text[:20]!r}, not a whole number")
        return SourceState(count=int(text))


@hookimpl
def arbiter_register_sources(register: Register) -> None:
    register("flag_file", FlagFileSource)
    register("counter_file", CounterFileSource)
