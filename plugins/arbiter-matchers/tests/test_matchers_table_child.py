"""The process table scanned in a child process: the same table, and a child that dies,
hangs or answers garbage never costs the daemon its table."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from arbiter.plugin import ChildWorker, ProcessInfo
from arbiter_matchers import arbiter_process_table, table
from arbiter_matchers.table import TableMemo, proc_table
from arbiter_testing.waiting import wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the child scans /proc")


def pids(rows: list[ProcessInfo]) -> set[int]:
    return {p.pid for p in rows}


def gone(pid: int, timeout: float = 10.0) -> bool:
    def exited() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # reaping is its new parent's business
        except psutil.NoSuchProcess:
            return True

    return wait_until(exited, timeout, f"pid {pid} to exit", poll_s=0.02)


def test_the_hook_scans_in_a_child_that_imports_only_the_standard_library() -> None:
    scratch: dict[str, object] = {}
    rows = arbiter_process_table(scratch=scratch)
    memo = scratch["arbiter_matchers.table"]
    assert isinstance(memo, TableMemo) and memo.child_pid is not None, getattr(memo, "child_failure", "")
    assert memo.child_pid in pids(rows) and os.getpid() in pids(rows)
    modules = {m.path for m in psutil.Process(memo.child_pid).memory_maps() if m.path.endswith(".so")}
    assert not any("psutil" in m or "pydantic" in m for m in modules), modules
    assert psutil.Process(memo.child_pid).memory_info().rss < 40 * 2**20  # a bare interpreter, not a second daemon


def test_the_child_gives_the_table_a_scan_here_gives() -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        memo = TableMemo(in_child=True)
        before = pids(proc_table())
        mine = {p.pid: p for p in memo.table()}
        here = {p.pid: p for p in proc_table()}
        after = pids(proc_table())
        # processes that do not change between the two scans (others may exec or exit meanwhile)
        for pid in (sleeper.pid, os.getpid(), 1):
            assert replace(mine[pid], state="") == replace(here[pid], state="")
        # and every process there all along, through both scans, is in both (other tests'
        # processes come and go meanwhile)
        through = before & after
        assert through <= mine.keys() and through <= here.keys(), sorted(through - (mine.keys() & here.keys()))
        assert not memo.child_failure
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_child_that_dies_is_replaced_by_a_scan_here_and_tried_again_later() -> None:
    memo = TableMemo(in_child=True)
    first = memo.table()
    child = memo.child_pid
    assert child is not None
    os.kill(child, signal.SIGKILL)
    rows = memo.table()
    assert "exited" in memo.child_failure and memo.child_pid is None
    assert os.getpid() in pids(rows) and child not in pids(rows)
    # the whole table, read here: every process there through both scans (other tests'
    # processes come and go meanwhile)
    through = pids(first) & pids(proc_table()) - {child}
    assert through <= pids(rows), sorted(through - pids(rows))
    assert memo.table() and memo.child_pid is None  # not started again before the retry time
    memo._child._retry_at = 0.0  # type: ignore[union-attr]
    again = memo.table()
    assert memo.child_pid not in (None, child) and memo.child_pid in pids(again)


def test_a_child_that_hangs_is_killed_after_the_timeout_and_the_table_read_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(table, "CHILD_TIMEOUT_S", 0.3)
    memo = TableMemo(in_child=True)
    before = {p.pid: p for p in memo.table()}
    child = memo.child_pid
    assert child is not None
    os.kill(child, signal.SIGSTOP)
    started = time.monotonic()
    rows = memo.table()
    assert 0.3 <= time.monotonic() - started < 2.0
    assert "did not answer within 0.3s" in memo.child_failure
    assert gone(child)
    # read here from a fresh start: every process is built anew, none is stale
    assert os.getpid() in pids(rows) and all(p is not before.get(p.pid) for p in rows)


#: a work module whose answer to every request is the one it was made with
LIAR = """\
class Liar:
    def __init__(self, answer):
        self.answer = answer

    def __call__(self, request):
        return self.answer
"""


@pytest.mark.parametrize(
    "answer",
    [
        ([10**9], []),  # a pid it never described
        ([1], [(1, "not a ppid")]),  # a record that is not a process's
        (["1"], []),  # a pid that is not a number
        ("yes",),  # not a scan
    ],
    ids=["left-out", "not-a-record", "not-a-pid", "not-a-scan"],
)
def test_a_child_that_answers_garbage_is_given_up_and_the_table_read_here(
    answer: tuple[object, ...], tmp_path: Path
) -> None:
    liar = tmp_path / "liar.py"
    liar.write_text(LIAR)
    memo = TableMemo(in_child=True)
    memo.table()
    memo._child = ChildWorker(str(liar), "Liar", answer)
    assert memo._child.call(None) == answer
    liar_pid = memo.child_pid
    rows = memo.table()
    assert os.getpid() in pids(rows) and 10**9 not in pids(rows)
    assert memo.child_pid is None and "the child worker was given up: it " in memo.child_failure
    assert liar_pid is not None and gone(liar_pid)


def test_a_dropped_memo_ends_its_child() -> None:
    memo = TableMemo(in_child=True)
    memo.table()
    child = memo.child_pid
    assert child is not None
    del memo
    assert gone(child)
