"""The crash bench (bench/crash_recovery.py) in small: a few SIGKILLs of a real daemon at
random moments, every invariant checked after each restart, and its figures printed."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from arbiter_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    return load_script(ROOT / "bench" / "crash_recovery.py", "crash_recovery")


def test_three_kills_break_no_invariant_and_the_counts_are_printed(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _load()
    rc = bench.main(["--kills", "3", "--seed", "7", "--max-wait", "2"])
    out = capsys.readouterr().out
    print(out)
    assert "3 SIGKILLs (seed 7)" in out
    for check in bench.CHECKS:
        assert any(line.split()[:1] == [check] for line in out.splitlines()), f"no count printed for {check}"
    assert rc == 0, out
    total = next(line for line in out.splitlines() if line.startswith("total")).split()
    assert int(total[1]) >= 3 * 9 and total[2] == "0"  # nine checks per kill ran and passed
    assert "phase flips written" in out and "blocks recorded by the A/B run" in out
