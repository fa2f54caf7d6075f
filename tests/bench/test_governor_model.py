"""bench/governor.py --model: the engine's own governor against model slowdown curves, with a
fake clock.  A few runs per curve: near the oracle, under the target, back under it fast."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from arbiter_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
bench = load_script(ROOT / "bench" / "governor.py", "governor_bench")


def test_each_curve_settles_near_its_oracle_under_the_target() -> None:
    rng = random.Random(11)
    for name, curve in bench.CURVES.items():
        runs = [bench.model(curve, 60, rng) for _ in range(12)]
        for label, load in (("before", 1.0), ("after", bench.LOAD_STEP)):
            oracle = bench.oracle_duty(curve, load)
            share = sum(r[label][0] for r in runs) / len(runs) / oracle
            slowdown = sum(r[label][1] for r in runs) / len(runs)
            assert share >= 0.8, (name, label, share)
            assert slowdown <= bench.TARGET, (name, label, slowdown)
        assert all(r["recovered_in"] is not None and r["recovered_in"] <= 2 for r in runs), name


def test_the_model_report_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.run_model(20, 3, 2) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in bench.CURVES) and "goal ≥ 85%" in out
