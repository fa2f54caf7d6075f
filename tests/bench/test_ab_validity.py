"""The ON/OFF procedure's simulation (bench/ab_validity.py): its vectorised statistics agree
with abstats itself, and a small run of it shows the procedure's error rates near their goals."""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from arbiter.engine import abconfirm
from arbiter.engine.abstats import (
    CONFIDENCE,
    FIRST_LOOK_CONFIDENCE,
    Block,
    analyse,
    blocks_needed,
    blocks_within,
    change_statistic,
    drift_phi,
    end_intervals,
    look_confidence,
    planned_hours,
    runs_on,
)
from arbiter_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    return load_script(ROOT / "bench" / "ab_validity.py", "ab_validity")


abv = _load()  # which puts bench/ on the path its parts are imported from
sim = load_script(ROOT / "bench" / "ab_sim.py", "ab_sim")
conf = load_script(ROOT / "bench" / "ab_confirmation.py", "ab_confirmation")
MARGIN = 0.02


def as_blocks(d: np.ndarray, on_first: np.ndarray, off: np.ndarray) -> list[Block]:
    # through real rates, so abstats takes the logarithm itself
    return [
        Block(on=float(o * math.exp(x)), off=float(o), on_first=bool(f))
        for x, f, o in zip(d, on_first, off, strict=True)
    ]


def varied_d(rng: np.random.Generator, rows: int, blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows with very different true R and SD, so every verdict and sizing outcome turns up."""
    r = rng.choice([1.01, 1.0, 0.99, 0.97, 0.95], size=rows)
    sd = rng.choice([0.002, 0.01, 0.03, 0.1], size=rows)
    d = np.log(r)[:, None] + sd[:, None] * rng.standard_normal((rows, blocks))
    return d, rng.random((rows, blocks)) < 0.5


def test_vectorised_analysis_matches_abstats() -> None:
    rng = np.random.default_rng(7)
    seen: set[str] = set()
    for blocks, rows, pilot in [(2, 6, 0), (3, 8, 0), (4, 8, 0), (6, 8, 4), (7, 8, 0), (12, 10, 4), (20, 10, 4)]:
        d, on_first = varied_d(rng, rows, blocks)
        got = sim.analyse_fixed(d, MARGIN, pilot)
        for i in range(rows):
            want = analyse(as_blocks(d[i], on_first[i], rng.uniform(50, 150, blocks)), MARGIN, pilot)
            assert sim.VERDICTS[got["verdict"][i]] == want.verdict
            for key in ("r", "low", "high"):
                assert got[key][i] == pytest.approx(getattr(want, key), abs=1e-9)
            seen.add(want.verdict)
        paired = sim.analyse_fixed(d, MARGIN, pilot, robust=False)  # the procedure without drift allowance
        for i in range(rows):
            want = analyse(as_blocks(d[i], on_first[i], np.full(blocks, 100.0)), MARGIN, pilot)
            assert paired["low"][i] == pytest.approx(want.t_low, abs=1e-9)
    assert len(seen) >= 3  # the check is only worth something if it met several verdicts


def test_vectorised_sizing_matches_blocks_needed() -> None:
    rng = np.random.default_rng(11)
    pilot, on_first = varied_d(rng, 60, 4)
    for most in (None, 44, 8):
        got = sim.size_runs(pilot, MARGIN, most)
        want = [blocks_needed(as_blocks(pilot[i], on_first[i], np.full(4, 100.0)), MARGIN, most) for i in range(60)]
        assert [int(g) or None for g in got] == want
        assert None in want and any(w is not None and w > 8 for w in want)


def test_whole_procedure_matches_a_run_by_hand() -> None:
    rng = np.random.default_rng(3)
    d, on_first = varied_d(rng, 24, sim.most_blocks())
    d[:, :4] *= rng.choice([0.3, 1.0], size=(24, 1))  # quieter pilots too, so more runs go ahead
    runs = sim.run_procedure(d, MARGIN)
    most = blocks_within(sim.MAX_HOURS, sim.WINDOW_S)
    ran = extended = 0
    for i in range(24):
        n = blocks_needed(as_blocks(d[i, :4], on_first[i, :4], np.full(4, 100.0)), MARGIN, most - 4)
        total = max(sim.PLANNED_BLOCKS, 4 + (n or 0))
        assert int(runs["n"][i]) == (n or 0)
        if n is None or planned_hours(total, sim.WINDOW_S) > sim.MAX_HOURS:
            assert runs["verdict"][i] == sim.REFUSED and runs["blocks"][i] == 4
            continue
        ran += 1
        # two looks: the first where the run was sized to end, the last at the most its hours allow
        want = analyse(
            as_blocks(d[i, :total], on_first[i, :total], np.full(total, 100.0)),
            MARGIN,
            4,
            look_confidence(0, total, most),
        )
        if want.confidence == FIRST_LOOK_CONFIDENCE and runs_on(want, MARGIN):
            extended += 1
            total = most
            want = analyse(
                as_blocks(d[i, :total], on_first[i, :total], np.full(total, 100.0)),
                MARGIN,
                4,
                look_confidence(1, total, most),
            )
        assert runs["blocks"][i] == total and bool(runs["extended"][i]) == (
            total == most and want.confidence != CONFIDENCE
        )
        assert sim.VERDICTS[runs["verdict"][i]] == want.verdict
        assert runs["low"][i] == pytest.approx(want.low, abs=1e-9)
    assert 0 < ran < 24 and 0 < extended < ran


def test_a_trend_is_centred_on_the_analysed_blocks() -> None:
    """The trend model's truth is R at the middle of the analysed blocks: with no noise at all,
    every run's R is the true one."""
    rng = np.random.default_rng(9)
    d, _, slope, _ = sim.generate_d("trend", 0.99, 0.02, 50, sim.most_blocks(), rng)
    assert slope > 0
    d[:, :4] = math.log(0.99) + rng.normal(0, 0.002, (50, 4))  # quiet pilots: the runs go ahead
    ramp = math.log(0.99) + slope * np.arange(d.shape[1])
    d[:, 4:] = ramp[None, 4:]
    runs = sim.run_procedure(d, MARGIN, slope=slope)
    assert np.allclose(runs["r"][runs["verdict"] != sim.REFUSED], 0.99)


def test_small_simulation_meets_its_goals() -> None:
    rng = np.random.default_rng(2025)
    null = abv.simulate(1.00, 0.02, "gaussian", 2000, rng)
    edge = abv.simulate(0.98, 0.02, "gaussian", 2000, rng)
    drift = abv.simulate(0.98, 0.02, "ar1-0.5", 2000, rng)
    for cell in (null, edge, drift):
        # the 90 % interval at the run's end is calibrated; the verdict's own is wider at a first look
        assert 0.86 <= cell["coverage90"] <= 0.95 and cell["coverage"] >= cell["coverage90"]
    assert edge["p_certify"] <= 0.07 and drift["p_certify"] <= 0.07
    assert null["p_certify"] > 0.7


def test_under_drift_two_looks_run_on_to_the_hours() -> None:
    """AR(1) drift with phi = 0.5, SD 0.02: most runs are inconclusive where they were planned to
    end and go on to the hours' end; a slowed program's certification stays near 5 %.  With the
    ends judged too, a harmless job certifies about a third of the time (0.34 over 10,000 runs)."""
    rng = np.random.default_rng(49)
    null = abv.simulate(1.00, 0.02, "ar1-0.5", 2000, rng)
    edge = abv.simulate(0.98, 0.02, "ar1-0.5", 2000, rng)
    assert null["p_certify"] > 0.25 and null["p_extended"] > 0.5 and null["max_blocks"] == sim.most_blocks()
    assert edge["p_certify"] <= 0.065


def test_a_walk_over_a_steady_model_starts_at_the_cells_r() -> None:
    rng = np.random.default_rng(21)
    d, on_first, slope, path = sim.generate_d("walk-0.5/ar1-0.5", 0.98, 0.02, 400, 48, rng)
    assert slope == 0.0 and on_first.dtype == bool and np.allclose(path[:, 0], math.log(0.98))
    noise = d - path
    lag = (noise[:, :-1] * noise[:, 1:]).mean() / (noise * noise).mean()
    assert 0.4 < lag < 0.6 and 0.017 < noise.std() < 0.023  # the base's own noise, beside the walk
    steps = np.diff(path, axis=1)
    assert 0.008 < steps.std() < 0.012  # half the block SD a step
    assert set(sim.WALKS) >= {"walk-0.1", "walk-0.25/t3", "walk-0.5/order"} and not any("trend" in w for w in sim.WALKS)


def test_vectorised_ends_match_abstats() -> None:
    rng = np.random.default_rng(13)
    for model, blocks in (("walk-0.5", 16), ("walk-0.25/ar1-0.5", 27), ("gaussian", 5)):
        d, _, _, _ = sim.generate_d(model, 0.99, 0.02, 20, blocks, rng)
        for confidence in (CONFIDENCE, FIRST_LOOK_CONFIDENCE):
            low, mean = sim.end_lows(d, confidence)
            for i in range(d.shape[0]):
                row = [float(x) for x in d[i]]
                ends = end_intervals(row, drift_phi(row), confidence)
                assert ends is not None
                assert low[i] == pytest.approx(min(e.low for e in ends), abs=1e-12)
                assert mean[i] == pytest.approx(min(e.mean for e in ends), abs=1e-12)


def test_a_walk_from_the_margin_is_rarely_certified() -> None:
    """The effect begins at 1 − margin and wanders: any certificate is false, since it vouches
    for the effect throughout the run.  Without the ends judged, 0.28 of such runs certified."""
    rng = np.random.default_rng(50)
    bound = 0.05 + 3 * math.sqrt(0.05 * 0.95 / 2000)
    for model in ("walk-0.25", "walk-0.5/order"):
        cell = abv.simulate(0.98, 0.02, model, 2000, rng)
        assert cell["p_false_start"] == cell["p_certify"] <= bound, (model, cell)
    steady = abv.simulate(1.0, 0.02, "walk-0.25", 500, rng)
    assert math.isnan(steady["p_false_start"])  # the measure is where the walk begins at the margin


def test_vectorised_change_statistic_matches_abstats() -> None:
    rng = np.random.default_rng(12)
    for model in ("gaussian", "walk-0.5", "shift", "sine"):
        d, _, _, _ = sim.generate_d(model, 0.99, 0.02, 20, 16, rng)
        got = sim.change_statistic(d)
        for i in range(d.shape[0]):
            want = change_statistic([float(x) for x in d[i]])
            assert want is not None and got[i] == pytest.approx(want, rel=1e-9)


def test_where_the_effect_moves_false_certification_is_judged_on_the_second_half() -> None:
    """A noiseless shift from R·e^0.02 to R·e^−0.02: the path is the effect, and a run's truth
    is its mean over the analysed blocks."""
    rng = np.random.default_rng(4)
    d, _, _, path = sim.generate_d("shift", 0.98, 0.01, 200, sim.most_blocks(), rng)
    assert np.allclose(d.std(axis=0).mean(), 0.01, rtol=0.5) and set(np.round(np.unique(path), 6)) == {
        round(math.log(0.98) + 0.02, 6),
        round(math.log(0.98) - 0.02, 6),
    }
    cell = abv.simulate(0.99, 0.02, "shift", 2000, rng)
    assert 0.85 <= cell["coverage90"] <= 0.99  # more runs go on to their hours, whose interval covers more
    assert cell["p_false"] <= 0.07 and cell["p_withheld"] < cell["p_certify"]
    steady = abv.simulate(1.0, 0.02, "gaussian", 2000, rng)
    assert math.isnan(steady["p_false"]) and steady["p_withheld"] < 0.02


def test_the_vectorised_confirmation_matches_abconfirm() -> None:
    """A twin's confirmation as the bench simulates it: sized and analysed as abconfirm does."""
    rng = np.random.default_rng(11)
    for original_n, confirm_n in [(12, 8), (20, 11)]:
        d, on_first = varied_d(rng, 8, original_n)
        off = rng.uniform(50, 150, original_n)
        sizes = conf.confirm_sizes(d, MARGIN)
        c, c_first = varied_d(rng, 8, confirm_n)
        got = sim.analyse_fixed(np.concatenate([d, c], axis=1), MARGIN, pilot=original_n)
        for i in range(8):
            original = as_blocks(d[i], on_first[i], off)
            assert sizes[i] == (abconfirm.blocks_for(original, MARGIN) or 0)
            want = abconfirm.judge(original, 0.0, 2.0, as_blocks(c[i], c_first[i], off[:confirm_n]), MARGIN)
            assert math.isclose(want.analysis.low, got["low"][i], rel_tol=1e-9)
            assert math.isclose(want.analysis.high, got["high"][i], rel_tol=1e-9)


def test_a_twin_unlike_its_original_is_rarely_certified() -> None:
    """The worst case for a twin: its original truly unslowed, itself slowed by the margin."""
    cell = conf.confirmation_cell(1.0, 1 - MARGIN, 0.02, "gaussian", 2000, np.random.default_rng(5), MARGIN)
    assert cell["worst_twin"] <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 2000), cell
    assert cell["confirm_blocks"] < cell["run_blocks"], cell
