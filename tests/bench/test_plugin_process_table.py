"""bench/plugin_process_table.py, run small: every way of reading the table, one line each."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from arbiter_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the memo and its child read /proc")
def test_a_small_run_prints_a_line_for_every_reading(capsys: pytest.CaptureFixture[str]) -> None:
    load_script(ROOT / "bench" / "plugin_process_table.py", "plugin_process_table").main(
        ["--processes", "0", "--rounds", "2"]
    )
    lines = capsys.readouterr().out.splitlines()
    labels = [line.split(" processes")[0].rsplit(" ", 1)[0].strip() for line in lines]
    assert labels == ["memo, in a child", "memo, here", "memo, no kept files", "process_table, bare", "psutil_table"]
    assert all("CPU of the calling thread" in line for line in lines)
