"""The paired ON/OFF statistics: quantiles, R and its intervals, verdicts, sizing, checks."""

from __future__ import annotations

import math
import random

import pytest

from arbiter.engine.abstats import Block, analyse, blocks_needed, chi2_quantile, planned_hours, t_quantile


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


def test_r_is_the_geometric_mean_ratio_with_a_paired_t_interval() -> None:
    ratios = [0.99, 1.01, 1.0, 0.995, 1.005, 1.0]
    a = analyse(blocks(ratios), margin=0.02)
    d = [math.log(r) for r in ratios]
    mean = sum(d) / len(d)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1))
    half = t_quantile(0.95, 5) * sd / math.sqrt(len(d))
    assert a.r == pytest.approx(math.exp(mean)) and a.low == pytest.approx(math.exp(mean - half))
    assert a.high == pytest.approx(math.exp(mean + half)) and a.sd == pytest.approx(sd)
    assert a.verdict == "no slowdown shown" and a.certifies
    low, high = a.fieller  # the cross-check agrees closely on such data
    assert low == pytest.approx(a.low, abs=0.01) and high == pytest.approx(a.high, abs=0.01)


def test_a_slowdown_smaller_than_the_margin_certifies() -> None:
    a = analyse(blocks([0.99, 0.991, 0.989, 0.99, 0.9905, 0.9895]), margin=0.02)
    assert a.high < 1 and a.low > 0.98
    assert a.verdict == "slowdown smaller than the margin" and a.certifies


def test_a_clear_slowdown() -> None:
    a = analyse(blocks([0.90, 0.92, 0.91, 0.89, 0.905, 0.915]), margin=0.02)
    assert a.verdict == "slowdown" and not a.certifies and a.high < 1


def test_inconclusive_says_how_many_more_blocks() -> None:
    a = analyse(blocks([1.03, 0.97, 1.02, 0.98, 1.01]), margin=0.02)
    assert a.verdict == "inconclusive" and a.more_blocks is not None and a.more_blocks > 0
    d = [math.log(r) for r in [1.03, 0.97, 1.02, 0.98, 1.01]]
    t = t_quantile(0.95, 4)
    expected = math.ceil((t * a.sd / (math.log(a.r) - math.log(0.98))) ** 2) - len(d)
    assert a.more_blocks == max(1, expected) and f"{a.more_blocks} more" in a.why


def test_inconclusive_below_the_margin_will_not_be_decided() -> None:
    a = analyse(blocks([0.93, 1.02, 0.95, 1.01, 0.96]), margin=0.02)
    assert a.verdict == "inconclusive" and a.more_blocks is None and "no realistic" in a.why


def test_lag_one_autocorrelation_and_order_effect() -> None:
    drifting = blocks([1.0 + 0.002 * i for i in range(10)])
    assert analyse(drifting, margin=0.02).lag1 > 0.5
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
    assert needed is not None and needed >= 4
    noisy = blocks([1.2, 0.8, 1.15, 0.85])
    assert blocks_needed(noisy, margin=0.02) is None  # no realistic run reaches the margin
    assert planned_hours(12, 300) == pytest.approx(12 * 2 * 300 / 3600)  # the washout is inside each window


def test_bad_input_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        analyse(blocks([1.0]), margin=0.02)
    with pytest.raises(ValueError, match="above 0"):
        analyse([Block(0.0, 1.0), Block(1.0, 1.0)], margin=0.02)
