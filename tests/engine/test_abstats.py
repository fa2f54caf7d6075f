"""The paired ON/OFF statistics: quantiles, R and its intervals, verdicts, sizing, checks."""

from __future__ import annotations

import math
import random

import pytest

from arbiter.engine.abstats import (
    CHANGE_CRITICAL,
    CONFIDENCE,
    DRIFT_FLAT,
    DRIFT_SHARE,
    END_SHARE,
    FIRST_LOOK_CONFIDENCE,
    LAST_LOOK_CONFIDENCE,
    PHI_HIGH,
    PHI_LOW,
    ROBUST_ALLOWANCE,
    Block,
    Interval,
    _judge_ends,
    analyse,
    blocks_needed,
    change_statistic,
    drift_phi,
    end_blocks,
    end_intervals,
    interval,
    look_confidence,
    planned_hours,
    runs_on,
    variance_factor,
)
from arbiter.engine.quantiles import chi2_quantile, t_quantile


@pytest.mark.parametrize(
    ("p", "nu", "expected"),
    [
        (0.95, 1, 6.3138),
        (0.95, 2, 2.9200),
        (0.95, 3, 2.3534),
        (0.95, 10, 1.8125),
        (0.95, 30, 1.6973),
        (0.975, 5, 2.5706),
    ],
)
def test_t_quantiles(p: float, nu: int, expected: float) -> None:
    assert t_quantile(p, nu) == pytest.approx(expected, abs=5e-4)
    assert t_quantile(1 - p, nu) == pytest.approx(-expected, abs=5e-4)


@pytest.mark.parametrize(
    ("p", "k", "expected"), [(0.20, 3, 1.0052), (0.20, 10, 6.1791), (0.95, 4, 9.4877), (0.05, 1, 0.00393)]
)
def test_chi2_quantiles(p: float, k: int, expected: float) -> None:
    assert chi2_quantile(p, k) == pytest.approx(expected, rel=2e-3)


def blocks(ratios: list[float], off: float = 100.0) -> list[Block]:
    return [Block(on=off * r, off=off, on_first=i % 2 == 0) for i, r in enumerate(ratios)]


def test_r_is_the_geometric_mean_ratio_with_a_drift_robust_interval() -> None:
    ratios = [0.99, 1.01, 1.0, 0.995, 1.005, 1.0]
    a = analyse(blocks(ratios), margin=0.02)
    d = [math.log(r) for r in ratios]
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    half = t_quantile(0.95, n - 1) * sd / math.sqrt(n)
    assert a.r == pytest.approx(math.exp(mean)) and a.sd == pytest.approx(sd)
    # the paired t-interval is reported beside the one the verdict uses
    assert a.t_low == pytest.approx(math.exp(mean - half)) and a.t_high == pytest.approx(math.exp(mean + half))
    # the robust one: the bias-corrected lag-1 estimate plus the allowance, the AR(1) variance of a mean
    dev = [x - mean for x in d]
    r1 = sum(dev[i] * dev[i + 1] for i in range(n - 1)) / sum(x * x for x in dev)
    est = (n * r1 + 1) / (n - 3)
    phi = min(PHI_HIGH, max(PHI_LOW, est + DRIFT_FLAT + DRIFT_SHARE * max(est, 0.0)))
    assert a.phi == pytest.approx(phi) and a.lag1 == pytest.approx(r1)
    vif = 1 + 2 * sum((1 - k / n) * phi**k for k in range(1, n))
    df = min(n - 1, max(1, math.floor(n / vif) - 1))
    robust = t_quantile(0.95, df) * math.sqrt(sd * sd / n * vif * (n - 1) / max(n - vif, 1.0))
    assert a.low == pytest.approx(math.exp(mean - robust)) and a.high == pytest.approx(math.exp(mean + robust))
    assert a.widening == pytest.approx(robust / half)
    assert a.method == "drift-robust" and f"{a.widening:.2f} ×" in a.method_why
    assert a.verdict == "no slowdown shown" and a.certifies
    assert a.fieller is not None
    low, high = a.fieller  # the cross-check agrees closely with the t-interval on such data
    assert low == pytest.approx(a.t_low, abs=0.01) and high == pytest.approx(a.t_high, abs=0.01)


def test_the_interval_for_independent_blocks_is_scipys_paired_t_interval() -> None:
    """An independent implementation: at an autocorrelation of 0 the interval is the log-scale
    paired t-interval of scipy.stats, to 1e-9."""
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(11)
    for n in (2, 3, 5, 8, 12, 30, 48):
        on = [100 * math.exp(rng.gauss(-0.01, 0.02)) for _ in range(n)]
        off = [100 * math.exp(rng.gauss(0.0, 0.01)) for _ in range(n)]
        d = [math.log(x / y) for x, y in zip(on, off, strict=True)]
        mean = sum(d) / n
        sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
        got = interval(mean, sd, n, phi=0.0)
        res = stats.ttest_rel([math.log(x) for x in on], [math.log(y) for y in off])
        want = res.confidence_interval(confidence_level=0.90)
        assert got.low == pytest.approx(want.low, abs=1e-9) and got.high == pytest.approx(want.high, abs=1e-9)
        assert got.df == n - 1 and got.vif == 1.0
        if n >= 3:  # and analyse reports it beside the robust one
            a = analyse([Block(x, y) for x, y in zip(on, off, strict=True)], margin=0.02)
            assert math.log(a.t_low) == pytest.approx(want.low, abs=1e-9)
            assert math.log(a.t_high) == pytest.approx(want.high, abs=1e-9)


def test_the_variance_factor_of_an_ar1_mean() -> None:
    assert variance_factor(0.0, 10) == 1.0
    # 1 + 2 Σ (1 − k/m) φ^k, against the closed form of the same sum
    phi, m = 0.5, 12
    closed = (1 + phi) / (1 - phi) - 2 * phi * (1 - phi**m) / (m * (1 - phi) ** 2)
    assert variance_factor(phi, m) == pytest.approx(closed)
    assert variance_factor(-0.3, 12) < 1  # alternating blocks average out faster


def test_drift_widens_the_interval_and_can_withhold_a_certificate() -> None:
    """A slow swing of R across blocks: the paired t-interval would certify, the robust one widens
    by the AR(1) variance of the mean and says why."""
    swing = [0.993, 0.992, 0.99, 0.988, 0.987, 0.988, 0.99, 0.993, 0.995, 0.996, 0.995, 0.992]
    a = analyse(blocks(swing), margin=0.02)
    assert a.lag1 is not None and a.lag1 > 0.5 and a.phi > a.lag1
    assert a.widening > 1.5 and a.low < a.t_low and a.high > a.t_high
    assert "drift-robust" in a.method_why and "autocorrelation" in a.method_why
    independent = analyse(
        blocks([0.993, 0.988, 0.995, 0.99, 0.996, 0.987, 0.993, 0.988, 0.992, 0.99, 0.995, 0.992]), 0.02
    )
    assert independent.widening < a.widening


def test_the_pilot_is_not_analysed() -> None:
    pilot = blocks([1.2, 1.2, 1.2, 1.2])  # a lucky pilot cannot lift R or narrow the interval
    rest = blocks([0.99, 1.01, 1.0, 0.995, 1.005, 1.0])
    a = analyse(pilot + rest, margin=0.02, pilot=4)
    b = analyse(rest, margin=0.02)
    assert a.n == 6 and a.pilot == 4 and a.r == pytest.approx(b.r) and a.sd == pytest.approx(b.sd)
    assert a.t_low == pytest.approx(b.t_low) and a.t_high == pytest.approx(b.t_high)
    with pytest.raises(ValueError, match="after the pilot"):
        analyse(pilot + rest[:1], margin=0.02, pilot=4)


def test_a_slowdown_smaller_than_the_margin_certifies() -> None:
    a = analyse(blocks([0.99, 0.991, 0.989, 0.99, 0.9905, 0.9895]), margin=0.02)
    assert a.high < 1 and a.low > 0.98
    assert a.verdict == "slowdown smaller than the margin" and a.certifies


def test_a_clear_slowdown() -> None:
    a = analyse(blocks([0.90, 0.92, 0.91, 0.89, 0.905, 0.915]), margin=0.02)
    assert a.verdict == "slowdown" and not a.certifies and a.high < 1


def test_inconclusive_says_how_many_more_blocks() -> None:
    a = analyse(blocks([1.03, 1.02, 0.97, 1.01, 0.98]), margin=0.02)
    assert a.verdict == "inconclusive" and a.more_blocks is not None and a.more_blocks > 0
    n = 5
    half = math.log(a.r) - math.log(a.low)  # the interval is symmetric on the log scale
    expected = math.ceil(n * (half / (math.log(a.r) - math.log(0.98))) ** 2) - n
    assert a.more_blocks == max(1, expected) and f"{a.more_blocks} more" in a.why


def test_inconclusive_below_the_margin_will_not_be_decided() -> None:
    a = analyse(blocks([0.93, 0.95, 1.02, 0.96, 1.01]), margin=0.02)
    assert a.verdict == "inconclusive" and a.more_blocks is None and "no realistic" in a.why


def test_lag_one_autocorrelation_and_order_effect() -> None:
    drifting = blocks([1.0 + 0.002 * i for i in range(10)])
    lag1 = analyse(drifting, margin=0.02).lag1
    assert lag1 is not None and lag1 > 0.5
    rng = random.Random(3)
    ordered = [
        Block(
            on=100 * (1.02 if i % 2 == 0 else 0.98) * (1 + rng.uniform(-0.001, 0.001)), off=100.0, on_first=i % 2 == 0
        )
        for i in range(12)
    ]
    a = analyse(ordered, margin=0.02)
    assert a.order_effect == pytest.approx(math.log(1.02) - math.log(0.98), abs=0.005) and a.order_effect_flag


def test_the_pilot_sizes_the_run_with_the_upper_confidence_limit_of_the_sd() -> None:
    pilot = blocks([1.01, 0.99, 1.005, 0.995])
    needed = blocks_needed(pilot, margin=0.02)
    sd = math.sqrt(sum(math.log(b.on / b.off) ** 2 for b in pilot) / 3)  # their mean is ~0
    upper = sd * math.sqrt(3 / chi2_quantile(0.20, 3))

    def enough(m: int) -> bool:  # m blocks reach the margin with the allowance
        return m >= ROBUST_ALLOWANCE * (t_quantile(0.95, m - 1) * upper / -math.log(0.98)) ** 2

    assert needed is not None and enough(needed) and not any(enough(m) for m in range(2, needed))
    assert needed == 6
    assert blocks_needed(pilot, margin=0.02, most=5) == 5  # the allowance is trimmed to the hours left
    assert blocks_needed(pilot, margin=0.02, most=3) == 4  # the paired t's own count is not: above most
    noisy = blocks([1.2, 0.8, 1.15, 0.85])
    assert blocks_needed(noisy, margin=0.02) is None  # no realistic run reaches the margin
    assert planned_hours(12, 300) == pytest.approx(12 * 2 * 300 / 3600)  # the washout is inside each window


def test_bad_input_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        analyse(blocks([1.0]), margin=0.02)
    with pytest.raises(ValueError, match="above 0"):
        analyse([Block(0.0, 1.0), Block(1.0, 1.0)], margin=0.02)


#: an effect that moves during a run: R near 1.00 for the first blocks, then lower; the interval
#: over the whole run alone would certify at a margin of 5 %
MOVED = [0.999, 1.007, 0.998, 0.995, 1.001, 0.998, 0.999, 0.994, 1.013, 0.987, 0.998, 0.994, 0.999, 0.993]


def test_the_change_statistic_is_the_largest_partial_sum_over_its_long_run_sd() -> None:
    d = [math.log(r) for r in MOVED]
    n, mean = len(d), sum(d) / len(d)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    partial = [abs(sum(x - mean for x in d[: k + 1])) for k in range(n - 1)]
    expected = max(partial) / (sd * math.sqrt(n * variance_factor(drift_phi(d), n)))
    assert change_statistic(d) == pytest.approx(expected)
    assert change_statistic(d[:3]) is None and change_statistic([0.01] * 6) is None


def test_a_certificate_is_withheld_when_the_effect_changed_during_the_run() -> None:
    a = analyse(blocks(MOVED), margin=0.05, pilot=4)
    assert a.low >= 0.95  # the interval alone would certify
    assert a.change is not None and a.change > CHANGE_CRITICAL
    assert a.verdict == "the effect changed" and not a.certifies
    assert "the effect changed during the run" in a.why and "no certificate" in a.why
    # the same blocks in an order that does not wander: certified
    steady = analyse(blocks(MOVED[:4] + MOVED[4::2] + MOVED[5::2]), margin=0.05, pilot=4)
    shuffled = [MOVED[i] for i in (0, 1, 2, 3, 8, 9, 4, 7, 6, 13, 10, 5, 12, 11)]
    assert steady.certifies or analyse(blocks(shuffled), margin=0.05, pilot=4).certifies


#: an effect that starts at 0.95 and wanders up (a random walk in steps smaller than the block
#: noise): the run's mean clears a margin of 5 % and no change test sees it, but its start is
#: not shown within the margin
WANDERED = [
    0.946,
    0.955,
    0.962,
    0.977,
    0.977,
    0.971,
    0.948,
    0.974,
    0.945,
    0.967,
    0.955,
    0.988,
    0.981,
    0.972,
    0.97,
    0.996,
]
#: ... one that sinks back to 0.95 by its last blocks
SANK = [0.94, 0.957, 0.951, 0.953, 0.959, 0.972, 0.95, 0.957, 0.973, 0.957, 0.963, 0.964, 0.941, 0.959, 0.93, 0.955]


def test_the_ends_are_their_shares_means_with_the_whole_runs_sd_and_df() -> None:
    d = [math.log(r) for r in WANDERED]
    n, k, phi = len(d), math.ceil(len(d) * END_SHARE), 0.3
    ends = end_intervals(d, phi, 0.9)
    assert ends is not None and k == 4
    sd = math.sqrt(sum((x - sum(d) / n) ** 2 for x in d) / (n - 1))
    whole, part = variance_factor(phi, n), variance_factor(phi, k)
    df = min(n - 1, max(1, math.floor(n / whole) - 1))
    half = t_quantile(0.95, df) * math.sqrt(sd * sd / k * part * (n - 1) / (n - whole))
    assert ends[0].mean == pytest.approx(sum(d[:k]) / k) and ends[1].mean == pytest.approx(sum(d[-k:]) / k)
    assert ends[0].half == pytest.approx(half) and ends[1].half == pytest.approx(half) and ends[0].df == df
    assert end_intervals(d[:3], phi) is None and end_intervals([0.01] * 6, phi) is None


def test_a_certificate_vouches_for_the_effect_at_the_runs_start_and_end() -> None:
    """The mean of an effect that wandered up from the margin clears it, and the change test
    sees nothing, but the first blocks' lower bound does not: inconclusive, with how many more."""
    a = analyse(blocks(WANDERED), margin=0.05, pilot=4)
    assert a.low >= 0.95 and a.change is not None and a.change <= CHANGE_CRITICAL  # the mean alone would certify
    assert a.verdict == "inconclusive" and not a.certifies and a.ends_short and a.more_blocks is not None
    assert a.ends is not None and a.end_blocks == 4 and a.ends[0][1] < 0.95 < a.ends[0][0]
    assert "over the run's first 4 blocks R = 0.9599, its lower bound 0.9438 below" in a.why
    assert f"about {a.more_blocks} more block(s)" in a.why and "start and end" in a.why
    assert runs_on(a, 0.05)  # at a first look the run goes on
    # an end whose own R is at or below the margin: no realistic run shows it within
    sank = analyse(blocks(SANK), margin=0.05, pilot=4)
    assert sank.low >= 0.95 and sank.verdict == "inconclusive" and sank.ends_short and sank.more_blocks is None
    assert "over the run's last 4 blocks R = 0.9462" in sank.why and "no realistic run" in sank.why


def test_an_end_shown_below_the_margin_is_an_effect_that_changed() -> None:
    """Where an end's whole 90 % interval is below the margin while the mean's is above, the effect
    is shown to have changed (an effect that moved so far the change test nearly always sees it
    first); at a first look the 90 % interval is the one that shows it."""
    floor = math.log(0.95)
    fine = Interval(-0.01, 0.02, 10, 1.0)
    below = Interval(-0.08, 0.02, 10, 1.0)  # up to −0.06, under ln 0.95
    unsure = Interval(-0.06, 0.03, 10, 1.0)  # up to −0.03
    verdict, why, more = _judge_ends((fine, below), (fine, below), floor, 16, "no slowdown shown", "w")
    assert verdict == "the effect changed" and more is None
    assert why.startswith("w, but over the run's last 4 blocks R = 0.9231, its whole 90 % interval below")
    verdict, _, _ = _judge_ends((fine, unsure), (fine, unsure), floor, 16, "no slowdown shown", "w")
    assert verdict == "inconclusive"
    wide = Interval(-0.08, 0.04, 10, 1.0)  # the look's wider interval reaches above the margin
    verdict, _, _ = _judge_ends((fine, wide), (fine, below), floor, 16, "no slowdown shown", "w")
    assert verdict == "the effect changed"
    assert _judge_ends((fine, fine), (fine, fine), floor, 16, "no slowdown shown", "w") == (
        "no slowdown shown",
        "w",
        None,
    )


def test_steady_blocks_are_not_withheld() -> None:
    rng = random.Random(11)
    withheld = 0
    for _ in range(200):
        ratios = [math.exp(rng.gauss(0.0, 0.01)) for _ in range(16)]
        withheld += analyse(blocks(ratios), margin=0.05, pilot=4).verdict == "the effect changed"
    assert withheld <= 6  # the test's own rate is well under 1 % (bench/ab_validity.py)


def test_the_looks_split_the_error_of_a_certificate_only() -> None:
    """At a first look the interval is 99 %: a margin that the usual 90 % would show is not
    shown yet, and the run goes on; a slowdown certifies nothing and is still shown at 90 %."""
    ons = [88.78, 88.96, 97.34, 83.95, 93.52, 84.11, 99.5, 95.12, 100.8, 91.85]
    slowed = [Block(on, 100.0) for on in ons]
    first = analyse(slowed, 0.05, pilot=4, confidence=FIRST_LOOK_CONFIDENCE)
    assert first.confidence == 0.99 and first.high >= 1  # the look's own interval reaches 1
    assert first.verdict == "slowdown" and "90 % interval is below 1" in first.why and not runs_on(first, 0.05)
    rnd = random.Random(11)
    fine = [Block(100 * math.exp(rnd.gauss(0.0, 0.03)), 100.0) for _ in range(14)]
    usual, early = analyse(fine, 0.05, pilot=4), analyse(fine, 0.05, pilot=4, confidence=FIRST_LOOK_CONFIDENCE)
    assert usual.certifies and early.verdict == "inconclusive" and early.low < usual.low and runs_on(early, 0.05)
    assert CONFIDENCE < LAST_LOOK_CONFIDENCE < FIRST_LOOK_CONFIDENCE  # the last look keeps most of the error
    assert (look_confidence(0, 12, 48), look_confidence(12, 48, 48), look_confidence(0, 48, 48)) == (
        FIRST_LOOK_CONFIDENCE,
        LAST_LOOK_CONFIDENCE,
        CONFIDENCE,
    )


def test_the_ends_stop_growing_past_48_blocks() -> None:
    """A quarter of a longer run would let a wandering effect move further within each end: the
    ends span a quarter of the blocks up to 48 of them, 12 blocks each past that."""
    rng = random.Random(4)
    d = [rng.gauss(0.0, 0.02) for _ in range(96)]
    ends = end_intervals(d, 0.3)
    assert ends is not None
    assert ends[0].mean == pytest.approx(sum(d[:12]) / 12) and ends[1].mean == pytest.approx(sum(d[-12:]) / 12)
    assert [end_blocks(n) for n in (4, 8, 40, 48, 49, 96, 200)] == [2, 2, 10, 12, 12, 12, 12]
    a = analyse(blocks([math.exp(x) for x in d]), margin=0.05, pilot=4)
    assert a.end_blocks == 12
    # past 48 blocks more blocks no longer narrow an end: an end not shown says no number will
    start = [0.951] * 12 + [1.0] * 48
    wandered = analyse(blocks([r * math.exp(rng.gauss(0.0, 0.004)) for r in start]), margin=0.05, pilot=4)
    assert wandered.low >= 0.95 and wandered.ends_short and wandered.more_blocks is None
    assert "no realistic run will decide it" in wandered.why
