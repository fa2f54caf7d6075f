"""The process table's memo: an unchanged process comes back as the very same object, and
anything that can change what a process is (an exec, a new command line, a new state) is
read afresh; the matcher's verdicts follow."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from arbiter.plugin import ProcessInfo
from arbiter_matchers.process import ProcessMatcher, ProcessOptions
from arbiter_matchers.table import TableMemo, process_table

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the memo serves the /proc table")


def find(table: list[ProcessInfo], pid: int) -> ProcessInfo:
    return next(p for p in table if p.pid == pid)


def until(memo: TableMemo, pid: int, ok: Callable[[ProcessInfo], bool]) -> ProcessInfo:
    deadline = time.monotonic() + 10
    while True:
        info = find(memo.table(), pid)
        if ok(info) or time.monotonic() > deadline:
            return info
        time.sleep(0.02)


def test_the_memo_gives_what_a_fresh_read_gives_and_reuses_unchanged_processes() -> None:
    child = subprocess.Popen(["sleep", "60"])
    try:
        memo = TableMemo()
        first = until(memo, child.pid, lambda p: p.name == "sleep")
        again = find(memo.table(), child.pid)
        assert again is first  # nothing changed: the same object, so matchers may reuse their verdict
        assert again == find(process_table(), child.pid)  # and what a read without the memo says

        os.kill(child.pid, signal.SIGSTOP)
        stopped = until(memo, child.pid, lambda p: p.state == "T")
        assert stopped.state == "T" and stopped.cmdline == first.cmdline and stopped is not first
        os.kill(child.pid, signal.SIGCONT)
    finally:
        child.kill()
        child.wait()


def test_an_exec_is_seen_by_the_memo_and_by_the_matcher() -> None:
    # a shell that waits for a file, then execs sleep: the same pid and start time, another program
    flag = f"/tmp/arbiter-memo-{os.getpid()}"
    script = f"while [ ! -e {flag} ]; do sleep 0.05; done; exec sleep 61"
    child = subprocess.Popen(["sh", "-c", script])
    matcher = ProcessMatcher(ProcessOptions(kind="process", name=["sleep"]))
    try:
        memo = TableMemo()
        before = until(memo, child.pid, lambda p: p.name == "sh")
        assert child.pid not in matcher.select(memo.table())
        open(flag, "w").close()
        after = until(memo, child.pid, lambda p: p.cmdline == ("sleep", "61"))
        assert after.name == "sleep" and after.start_time == before.start_time
        assert after.exe.endswith("sleep")
        assert child.pid in matcher.select(memo.table())
    finally:
        child.kill()
        child.wait()
        if os.path.exists(flag):
            os.unlink(flag)
