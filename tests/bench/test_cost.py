"""bench/cost.py's deterministic figures against their budget: a change that makes a hot path
(one tick and its decision, one scan where nothing changed, one phase line to its pause) do
half as much again as its budget fails here; the live figures stay in the bench."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from arbiter_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    return load_script(ROOT / "bench" / "cost.py", "cost_bench")


def test_the_hot_paths_stay_within_their_budget(capsys: pytest.CaptureFixture[str]) -> None:
    rc = _load().main(["--calls", "--check"])
    out = capsys.readouterr().out
    print(out)
    assert rc == 0, out
    for name in ("tick", "scan", "phase"):
        assert f"{name}: " in out


def test_a_path_over_its_budget_fails() -> None:
    bench = _load()
    budget = {"tick": 100, "scan": 100, "phase": 100}
    assert bench.over_budget({"tick": 150, "scan": 151, "phase": 10}, budget) == [
        f"scan: 151 calls, over {bench.BUDGET_SLACK:g} x its budget of 100 ({bench.BUDGET.name})"
    ]
