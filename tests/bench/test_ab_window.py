"""The continuous-time noise of bench/ab_time.py and the window rules of bench/ab_window.py: the
calibration reproduces the default window's block cell, a block is measured as the harness
measures it, and the bound the report states holds."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from arbiter.engine import abstats
from arbiter_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
sim = load_script(ROOT / "bench" / "ab_sim.py", "ab_sim")  # puts bench/ on the path
timed = load_script(ROOT / "bench" / "ab_time.py", "ab_time")
window = load_script(ROOT / "bench" / "ab_window.py", "ab_window")


@pytest.mark.parametrize("model", ["ou", "ou+w25", "ou+w40"])
def test_every_model_reproduces_the_default_windows_block_cell(model: str) -> None:
    """At 300 s windows d has SD 0.02 and lag-1 autocorrelation 0.5 (the block cell ar1-0.5),
    exactly by the covariance, and within sampling error when simulated step by step."""
    m = timed.calibrate(timed.TIMED[model], 0.02)
    cov = timed.d_cov(m, 300.0, 60.0, 3)
    assert math.sqrt(cov[0, 0]) == pytest.approx(0.02, rel=1e-6)
    assert cov[0, 1] / cov[0, 0] == pytest.approx(0.5, abs=1e-6)
    rng = np.random.default_rng(3)
    steps = round(8 * 3600 / timed.DT)
    effect = timed.ou_series(m, 1500, steps, rng)
    d, _, _ = timed.carve(effect, np.zeros((1, steps)), m.white, 0.0, 300.0, 60.0, 48, rng)
    assert d.std() == pytest.approx(0.02, rel=0.03)
    lag = float((d[:, :-1] * d[:, 1:]).mean() / (d * d).mean())  # the true mean is 0
    assert lag == pytest.approx(0.5, abs=0.03)
    # a longer window: its blocks correlate less, the simulation agreeing with the covariance
    d2, _, _ = timed.carve(effect, np.zeros((1, steps)), m.white, 0.0, 1200.0, 60.0, 12, rng)
    cov2 = timed.d_cov(m, 1200.0, 60.0, 2)
    assert float((d2[:, :-1] * d2[:, 1:]).mean() / (d2 * d2).mean()) == pytest.approx(cov2[0, 1] / cov2[0, 0], abs=0.04)
    assert cov2[0, 1] / cov2[0, 0] < 0.5


def test_a_block_is_its_on_windows_measured_part() -> None:
    """d is the mean of the ON window after its washout (the OFF window's effect is nothing), in
    the block's own order; the true ln R is the moving path's mean over the same part."""
    rng = np.random.default_rng(5)
    steps = 4 * 60  # two blocks of 300 s windows at 10 s steps
    effect = np.arange(steps, dtype=float)[None, :].repeat(3, axis=0)
    d, on_first, path = timed.carve(effect, effect, 0.0, 0.0, 300.0, 60.0, 2, rng)
    for row in range(3):
        for b in range(2):
            start = b * 60 + (0 if on_first[row, b] else 30) + 6
            assert d[row, b] == pytest.approx(np.arange(start, start + 24).mean())
            assert path[row, b] == d[row, b]


def test_the_pilot_lengthens_the_window_only_where_its_blocks_correlate() -> None:
    rng = np.random.default_rng(9)
    steady = 0.02 * rng.standard_normal((400, 4))
    climbing = np.array([[0.0, 0.01, 0.02, 0.03]]) + 1e-4 * rng.standard_normal((400, 4))
    assert (window.choose(steady) == 1).mean() > (window.choose(climbing) == 1).mean()
    assert (window.choose(climbing) == 4).all()
    # with too few hours for 8 blocks at 4 × the window, the pilot never chooses it
    assert (window.choose(climbing, max_hours=2.5) <= 2).all()


def test_no_window_lets_the_ends_reach_the_power_goal_within_8_hours() -> None:
    """The bound: even a test that knows the noise model exactly cannot certify a harmless job
    0.8 of the time when both ends (a quarter of the run's hours each) must clear the margin,
    whatever the window; a longer cap is what raises it."""
    for share in timed.TIMED.values():
        m = timed.calibrate(share, 0.02)
        for w in (300.0, 600.0, 900.0, 1200.0, 2400.0):
            _, power = timed.oracle_end_power(m, w, 60.0, abstats.blocks_within(8, w), 0.02)
            assert power < 0.6
    ou = timed.calibrate(0.0, 0.02)
    assert timed.oracle_end_power(ou, 300.0, 60.0, abstats.blocks_within(16, 300.0), 0.02)[1] > 0.8


def test_a_small_window_cell_runs_every_rule() -> None:
    got = window.cell("ou", "", 1.0, 300, np.random.default_rng(1))
    assert set(got) == set(window.RULES)
    assert 0.1 < got["300 s"]["certify"] < 0.6  # the block cell's 0.34, on 300 runs
    assert sum(got["pilot"][f"k{k}"] for k in window.MULTIPLES) == pytest.approx(1.0)


def test_a_longer_cap_keeps_the_walk_from_the_margin_under_its_goal() -> None:
    """With --max-hours 16 (96 blocks) a quarter of the run is 24 blocks, over which the walk
    moves further: the ends held at 12 blocks keep its false certification under 5 %."""
    rng = np.random.default_rng(16)
    blocks = sim.most_blocks(max_hours=16.0)
    d, _, _, _ = sim.generate_d("walk-0.25", 0.98, 0.02, 3000, blocks, rng)
    runs = sim.run_procedure(d, 0.02, max_hours=16.0)
    assert float(np.isin(runs["verdict"], (sim.NO_SLOWDOWN, sim.SMALLER)).mean()) < 0.04
