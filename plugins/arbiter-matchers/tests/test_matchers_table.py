"""The process table: real children, their start times and states."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import psutil
import pytest

from arbiter.plugin import ProcessInfo
from arbiter_matchers import arbiter_process_table
from arbiter_matchers.table import proc_table, process_table, psutil_table, state_code
from arbiter_testing.waiting import wait_until

TABLES: list[Callable[[], list[ProcessInfo]]] = [process_table, psutil_table]
if sys.platform.startswith("linux"):
    TABLES.append(proc_table)


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "arbiter-table-test"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def find(table: list[ProcessInfo], pid: int) -> ProcessInfo:
    for p in table:
        if p.pid == pid:
            return p
    raise AssertionError(f"pid {pid} missing from the process table")


def wait_for_state(read: Callable[[], list[ProcessInfo]], pid: int, *states: str) -> ProcessInfo:
    # A signal is delivered asynchronously: the state changes a moment after kill() returns.
    def in_state() -> ProcessInfo | None:
        info = find(read(), pid)
        return info if info.state in states else None

    return wait_until(in_state, 10, f"pid {pid} in state {' or '.join(states)}")


def test_the_hook_returns_the_table() -> None:
    table = arbiter_process_table(scratch={})
    assert isinstance(table, list) and all(isinstance(p, ProcessInfo) for p in table)
    assert os.getpid() in {p.pid for p in table}


@pytest.mark.parametrize("read", TABLES, ids=lambda f: f.__name__)
def test_a_child_is_listed_with_its_identity(
    read: Callable[[], list[ProcessInfo]], child: subprocess.Popen[bytes]
) -> None:
    info = find(read(), child.pid)
    assert info.ppid == os.getpid()
    assert info.cmdline[-1] == "arbiter-table-test"
    assert info.exe and os.path.samefile(info.exe, sys.executable)
    assert info.uid == os.getuid()
    assert info.username
    assert abs(info.start_time - psutil.Process(child.pid).create_time()) < 0.01
    assert abs(info.start_time - time.time()) < 60
    assert info.ref.pid == child.pid and info.ref.start_time == info.start_time


@pytest.mark.parametrize("read", TABLES, ids=lambda f: f.__name__)
def test_a_stopped_child_shows_state_T(read: Callable[[], list[ProcessInfo]], child: subprocess.Popen[bytes]) -> None:
    os.kill(child.pid, signal.SIGSTOP)
    try:
        assert wait_for_state(read, child.pid, "T").state == "T"
    finally:
        os.kill(child.pid, signal.SIGCONT)
    assert wait_for_state(read, child.pid, "S", "R").state in {"S", "R"}


@pytest.mark.parametrize("read", TABLES, ids=lambda f: f.__name__)
def test_a_zombie_child_is_listed_without_raising(read: Callable[[], list[ProcessInfo]]) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        info = wait_for_state(read, proc.pid, "Z")
        assert info.state == "Z"
    finally:
        proc.wait(timeout=10)
    assert proc.pid not in {p.pid for p in read()}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="compares /proc with psutil")
def test_proc_and_psutil_tables_agree(child: subprocess.Popen[bytes]) -> None:
    mine = {p.pid: p for p in proc_table()}
    theirs = {p.pid: p for p in psutil_table()}
    # Only processes that cannot change between the two scans: others may exec or exit.
    for pid in (child.pid, os.getpid(), os.getppid()):
        a, b = mine[pid], theirs[pid]
        assert (a.ppid, a.name, a.exe, a.cmdline, a.uid, a.username) == (
            b.ppid,
            b.name,
            b.exe,
            b.cmdline,
            b.uid,
            b.username,
        )
        assert a.start_time == b.start_time


def test_state_codes() -> None:
    assert state_code("stopped") == "T"
    assert state_code("running") == "R"
    assert state_code("sleeping") == "S"
    assert state_code("disk-sleep") == "D"
    assert state_code("zombie") == "Z"
    assert state_code("idle") == "I"
    assert state_code("") == ""
