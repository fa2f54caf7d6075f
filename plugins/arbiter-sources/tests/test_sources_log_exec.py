"""``log``, ``exec`` and ``on_exec`` against real files, real commands and process lists."""

from __future__ import annotations

import os
import shlex
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from arbiter.plugin import PluginContext, Source, SourceState
from arbiter_sources import ExecSource, LogSource, OnExecSource
from arbiter_sources.command import parse_rate
from arbiter_testing.waiting import wait_until


class Changes:
    def __init__(self) -> None:
        self.states: list[SourceState] = []
        self._lock = threading.Lock()

    def __call__(self, state: SourceState) -> None:
        with self._lock:
            self.states.append(state)

    def wait_for(self, fits: Callable[[SourceState], bool], timeout: float = 5.0) -> SourceState:
        """The latest state, once it fits."""

        def fitting() -> SourceState | None:
            with self._lock:
                latest = self.states[-1] if self.states else None
            return latest if latest is not None and fits(latest) else None

        try:
            return wait_until(fitting, timeout, "a fitting state", poll_s=0.001)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; latest: {self.states[-1:]}") from None


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    made: list[Source] = []

    def build(cls: type[Source], **block: Any) -> Any:
        source = cls(cls.Options.model_validate(block), PluginContext(state_dir=tmp_path))
        made.append(source)
        return source

    yield build
    for source in made:
        source.close()


def script(path: Path, body: str) -> str:
    path.write_text(f"#!{sys.executable}\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


# --- log --------------------------------------------------------------------------------


def test_log_counts_lines_the_regex_finds_written_after_open(tmp_path: Path, make: Callable[..., Any]) -> None:
    path = tmp_path / "train.log"
    path.write_text("step 1 done\nstep 2 done\n")
    source = make(LogSource, path=str(path), log_regex=r"step \d+ done")
    changes = Changes()
    source.start(changes)
    assert source.state().readable and source.state().count == 0  # history is not progress
    with open(path, "a") as fh:
        fh.write("step 3 done\nloss 0.1\nstep 4 do")
        fh.flush()
        changes.wait_for(lambda s: s.count == 1)
        fh.write("ne\n\xff garbage is text too\n")
    changes.wait_for(lambda s: s.count == 2)
    assert source.malformed == 0


def test_log_follows_the_newest_file_and_a_rotation(tmp_path: Path, make: Callable[..., Any]) -> None:
    source = make(LogSource, path=str(tmp_path / "run-*.log"), log_regex="^tick")
    changes = Changes()
    source.start(changes)
    (tmp_path / "run-1.log").write_text("tick\n")
    changes.wait_for(lambda s: s.readable and s.count == 1)
    os.rename(tmp_path / "run-1.log", tmp_path / "run-1.log.old")
    (tmp_path / "run-2.log").write_text("tick\ntick\n")
    changes.wait_for(lambda s: s.count == 3)


@pytest.mark.parametrize(("regex", "message"), [("(", "not a regular expression"), ("", "would match every line")])
def test_log_refuses_a_bad_regex(regex: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        LogSource.Options.model_validate({"kind": "log", "path": "/tmp/x.log", "log_regex": regex})


# --- exec -------------------------------------------------------------------------------


def test_exec_reports_the_rate_a_command_prints(tmp_path: Path, make: Callable[..., Any]) -> None:
    counter = tmp_path / "n"
    counter.write_text("12.5")
    cmd = script(tmp_path / "rate", f"print(open({str(counter)!r}).read())")
    source = make(ExecSource, command=[cmd], every_s=0.1)
    changes = Changes()
    source.start(changes)
    assert changes.wait_for(lambda s: s.readable).rate == 12.5
    counter.write_text("3")
    assert changes.wait_for(lambda s: s.rate == 3.0).readable


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("import sys; print('oops', file=sys.stderr); sys.exit(3)", "exited with 3: oops"),
        ("print('fast')", "printed 'fast', not a number"),
        ("print(-1)", "not a rate"),
        ("print('1\\n2')", "not a number"),
    ],
)
def test_exec_failure_or_garbage_is_unreadable(tmp_path: Path, make: Callable[..., Any], body: str, why: str) -> None:
    source = make(ExecSource, command=script(tmp_path / "bad", body))
    readable, rate, message = source.run_once()
    assert not readable and rate is None and why in message


def test_exec_a_command_that_hangs_is_killed_with_its_children(tmp_path: Path, make: Callable[..., Any]) -> None:
    pidfile = tmp_path / "child.pid"
    # a shell, not Python: it has its child and has said so long before the timeout, however loaded the host
    cmd = str(tmp_path / "hang")
    tmp, done = shlex.quote(f"{pidfile}.tmp"), shlex.quote(str(pidfile))
    Path(cmd).write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {tmp} && mv {tmp} {done}\nwait\n")
    Path(cmd).chmod(0o755)
    source = make(ExecSource, command=cmd, timeout_s=0.5)
    started = time.monotonic()
    readable, _, why = source.run_once()
    assert not readable and "did not finish within 0.5s" in why and time.monotonic() - started < 5
    child = int(pidfile.read_text())

    def ended() -> bool:  # killed; reaped by init, or not yet
        try:
            return Path(f"/proc/{child}/stat").read_text().split()[2] == "Z"
        except FileNotFoundError:
            return True

    wait_until(ended, 10, "the command's child to be killed")


def test_exec_a_missing_program_is_unreadable(make: Callable[..., Any]) -> None:
    readable, _, why = make(ExecSource, command="/nonexistent/rate --x").run_once()
    assert not readable and "cannot run /nonexistent/rate" in why


def test_exec_runs_no_shell_and_looks_nothing_up(tmp_path: Path, make: Callable[..., Any]) -> None:
    with pytest.raises(ValidationError, match="absolute path"):
        ExecSource.Options.model_validate({"kind": "exec", "command": "rate-tool --json"})
    marker = tmp_path / "marker"
    source = make(ExecSource, command=f"/bin/echo 1; touch {marker}")
    readable, _, _why = source.run_once()  # echo prints its arguments; nothing interprets ';'
    assert not readable and not marker.exists()
    assert ExecSource.Options.runs_command


def test_parse_rate() -> None:
    assert parse_rate(b" 4.25\n") == 4.25
    for bad in (b"", b"nan", b"inf", b"1 2", b"-0.5"):
        with pytest.raises(ValueError):
            parse_rate(bad)


# --- on_exec ----------------------------------------------------------------------------


def test_on_exec_phase_follows_the_processes_it_is_given(make: Callable[..., Any]) -> None:
    source = make(OnExecSource, match={"name": ["rsync"]})
    source.start(Changes())
    assert not source.state().readable and source.state().phase == "on"  # before the first list: fail safe
    source.processes(frozenset())
    first = source.state()
    assert first.readable and first.phase == "off"
    source.processes(frozenset({42}))
    on = source.state()
    assert on.phase == "on" and on.changed_at >= first.changed_at
    source.processes(frozenset({42, 43}))
    assert source.state() is on  # no change, no news
    assert OnExecSource.match_option == "match"
