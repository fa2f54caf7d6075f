"""The table keeps its processes in pid order as the kernel's process events add them: one
born above the highest pid goes last, and only one born below it (a pid handed out again)
has the table put in order anew."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from typing import Any

import pytest

from arbiter_matchers import table
from arbiter_matchers.table import TableMemo

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_a_process_born_above_the_highest_pid_goes_last_without_the_table_sorted_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    procs = sorted((subprocess.Popen(["sleep", "60"]) for _ in range(2)), key=lambda p: p.pid)
    low, high = procs[0].pid, procs[1].pid
    memo = TableMemo()
    sorts: list[int] = []

    def counting(items: Iterable[Any], **kw: Any) -> list[Any]:
        out = sorted(items, **kw)
        if out and isinstance(out[0], tuple):  # a table's (pid, process) pairs, not the pids asked
            sorts.append(len(out))
        return out

    try:
        whole = memo._scan_table()
        # the table as the events left it before ``high`` was born: every pid below it
        memo._infos = {p.pid: p for p in whole if p.pid < high}
        memo._quiet = memo._stripped({})
        monkeypatch.setattr(table, "sorted", counting, raising=False)
        memo._read_some({high})
        assert list(memo._infos) == sorted(memo._infos) and list(memo._infos)[-1] == high
        assert list(memo._quiet) == list(memo._infos) and sorts == []
        # one born below the highest (its pid handed out again): the table is put in order
        del memo._infos[low]
        del memo._quiet[low]
        memo._read_some({low})
        assert list(memo._infos) == sorted(memo._infos) and low in memo._infos
        assert list(memo._quiet) == list(memo._infos) and len(sorts) == 2
    finally:
        memo.close()
        for proc in procs:
            proc.kill()
            proc.wait()
