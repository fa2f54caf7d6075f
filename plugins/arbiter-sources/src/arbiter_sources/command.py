"""``exec``: a rate printed by a command the daemon runs (no shell), and ``on_exec``: a
phase that is on while a matching process runs."""

from __future__ import annotations

import logging
import math
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, field_validator

from arbiter.plugin import KindOptions, PluginContext, Source, SourceState, start_child

log = logging.getLogger(__name__)

#: more output than this is not a rate
MAX_OUTPUT_BYTES = 4096


class ExecOptions(KindOptions):
    """``{kind: exec, command, every_s, timeout_s}``: the command prints one number, a rate."""

    def gives_phase(self) -> bool:
        return False

    runs_command = True

    kind: Literal["exec"] = "exec"
    command: list[str] | str = Field(description="argv, or one line split as a shell would split it (no shell runs it)")
    every_s: float = Field(2.0, gt=0, le=3600, description="how often it runs")
    timeout_s: float = Field(5.0, gt=0, le=60, description="a run that takes longer is killed and reads as unreadable")

    @field_validator("command")
    @classmethod
    def _argv(cls, value: list[str] | str) -> list[str] | str:
        try:
            argv = shlex.split(value) if isinstance(value, str) else list(value)
        except ValueError as exc:
            raise ValueError(f"command cannot be split into words: {exc}") from None
        if not argv or not argv[0]:
            raise ValueError("command is empty")
        if not os.path.isabs(argv[0]):
            raise ValueError(
                f"command must start with an absolute path (got {argv[0]!r}): the daemon looks nothing up in PATH"
            )
        return value

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.command) if isinstance(self.command, str) else list(self.command)


def parse_rate(output: bytes) -> float:
    """The one non-negative number a command printed; ValueError for anything else."""
    text = output.decode("utf-8", "replace").strip()
    try:
        value = float(text)
    except ValueError:
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise ValueError(f"printed {shown!r}, not a number") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"printed {text!r}, not a rate (a finite number ≥ 0)")
    return value


class ExecSource(Source):
    """Runs its command every ``every_s`` on its own thread; each run's output is the rate."""

    Options = ExecOptions

    def __init__(self, options: ExecOptions, context: PluginContext) -> None:
        super().__init__(options, context)
        self.options: ExecOptions = options
        self._state = SourceState(readable=False, why="not run yet")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_change: Callable[[SourceState], None] | None = None
        self.runs = 0

    def start(self, on_change: Callable[[SourceState], None]) -> None:
        self._on_change = on_change
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"arbiter-exec:{self.options.argv[0]}", daemon=True)
            self._thread.start()

    def state(self) -> SourceState:
        return self._state

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.options.timeout_s + 2)

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            readable, rate, why = self.run_once()
            prev = self._state
            if (readable, rate, why) != (prev.readable, prev.rate, prev.why):
                self._state = SourceState(readable=readable, rate=rate, why=why, changed_at=time.monotonic())
                if self._on_change is not None:
                    try:
                        self._on_change(self._state)
                    except Exception:
                        log.exception("exec source %s: on_change failed", self.options.argv[0])
            self._stop.wait(max(0.0, self.options.every_s - (time.monotonic() - started)))

    def run_once(self) -> tuple[bool, float | None, str]:
        """(readable, rate, why not) from one run of the command."""
        argv = self.options.argv
        self.runs += 1
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": os.path.expanduser("~")}
        try:
            proc = start_child(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            return False, None, f"cannot run {argv[0]}: {exc.strerror or exc}"
        try:
            out, err = proc.communicate(timeout=self.options.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return False, None, f"{argv[0]} did not finish within {self.options.timeout_s:g}s"
        if proc.returncode != 0:
            detail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
            return (
                False,
                None,
                f"{argv[0]} exited with {proc.returncode}" + (f": {detail[0][:200]}" if detail[0] else ""),
            )
        if len(out) > MAX_OUTPUT_BYTES:
            return False, None, f"{argv[0]} printed {len(out)} bytes, not one number"
        try:
            return True, parse_rate(out), ""
        except ValueError as exc:
            return False, None, f"{argv[0]} {exc}"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: children it started go too
    except ProcessLookupError:
        pass
    try:
        proc.communicate(timeout=1)
    except subprocess.TimeoutExpired:
        # a grandchild that left the session still holds the pipes: stop reading them
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()


class OnExecOptions(KindOptions):
    """``{kind: on_exec, match: {...}}``: a phase that is on while a matching process runs."""

    def gives_phase(self) -> bool:
        return True

    kind: Literal["on_exec"] = "on_exec"
    match: dict[str, Any] = Field(description="a match block, as a rule's own match:")


class OnExecSource(Source):
    """Phase ``on`` while the processes its match block selects exist.

    The process list comes with the tick, which reads ``state()`` right after handing it
    over, so there is nothing to hand over in between (``on_change`` is never called).
    """

    Options = OnExecOptions
    match_option = "match"

    def __init__(self, options: OnExecOptions, context: PluginContext) -> None:
        super().__init__(options, context)
        self._state = SourceState(readable=False, phase="on", why="no process list yet (read on the tick)")

    def start(self, on_change: Callable[[SourceState], None]) -> None:
        pass

    def state(self) -> SourceState:
        return self._state

    def processes(self, pids: frozenset[int]) -> None:
        phase: Literal["on", "off"] = "on" if pids else "off"
        if not (self._state.readable and self._state.phase == phase):
            self._state = SourceState(
                readable=True, count=self._state.count + (phase == "on"), phase=phase, changed_at=time.monotonic()
            )
