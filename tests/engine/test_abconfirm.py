"""A twin's confirmation: sized from the original run's blocks, judged on its own blocks with
the drift estimated over both runs', refused when it disagrees with the original or does not
confirm it."""

from __future__ import annotations

import math
import random

from arbiter.engine import abconfirm
from arbiter.engine.abstats import Block, analyse


def blocks(r: float, sd: float, n: int, seed: int = 1) -> list[Block]:
    rng = random.Random(seed)
    return [Block(100.0 * math.exp(math.log(r) + rng.gauss(0, sd)), 100.0, i % 2 == 0) for i in range(n)]


ORIGINAL = blocks(1.0, 0.003, 16, seed=9)


def test_a_confirmation_is_sized_from_the_original_and_never_below_the_minimum() -> None:
    assert abconfirm.blocks_for(blocks(1.0, 0.001, 16), 0.02) == abconfirm.MIN_BLOCKS
    noisy = abconfirm.blocks_for(blocks(1.0, 0.02, 16), 0.02)
    assert noisy is not None and noisy > abconfirm.MIN_BLOCKS
    assert abconfirm.blocks_for(blocks(1.0, 0.5, 16), 0.02) is None  # no realistic run confirms it
    assert abconfirm.blocks_for(blocks(1.0, 0.01, 1), 0.02) is None


def test_a_confirmation_that_shows_no_slowdown_adopts() -> None:
    j = abconfirm.judge(ORIGINAL, 0.99, 1.01, blocks(1.0, 0.003, 8), 0.02)
    assert j.adopts and "confirmed here over 8 blocks" in j.why and j.analysis.n == 8


def test_the_drift_is_estimated_over_the_original_too() -> None:
    """A short confirmation alone assumes a large autocorrelation (its estimate's allowance at
    few blocks), which widens its interval past deciding; with the original's blocks beside it
    the same blocks decide."""
    short = [Block(b.on, b.off, b.on_first) for b in blocks(1.0, 0.004, 8, seed=1)]
    alone = analyse(short, 0.02)
    pooled = abconfirm.judge(ORIGINAL, 0.99, 1.01, short, 0.02).analysis
    assert pooled.phi < alone.phi and pooled.high - pooled.low < alone.high - alone.low
    assert pooled.r == alone.r  # R is the confirmation's own


def test_a_confirmation_slowed_beyond_the_original_disagrees() -> None:
    j = abconfirm.judge(ORIGINAL, 0.99, 1.01, blocks(0.9, 0.003, 8), 0.02)
    assert j.outcome == "disagrees" and not j.adopts and "slowed more on this node" in j.why


def test_an_inconclusive_confirmation_does_not_confirm() -> None:
    j = abconfirm.judge(blocks(1.0, 0.02, 16), 0.95, 1.01, blocks(0.975, 0.02, 8, seed=2), 0.02)
    assert j.outcome == "not confirmed" and "below 1 − margin" in j.why, j


def test_a_twin_is_judged_on_its_own_blocks_not_on_where_the_original_began() -> None:
    """The original's first blocks, near the margin, say nothing of this node: pooled with the
    confirmation's, they made its first quarter, and its change test, refuse a true twin."""
    original = [Block(90.5 + (i % 2), 100.0) for i in range(6)] + [
        Block(99.0 + (i % 2) * 0.4, 100.0) for i in range(10)
    ]
    here = [Block(98.9 + (i % 2) * 0.3, 100.0) for i in range(8)]
    verdict = abconfirm.judge(original, 0.95, 1.0, here, 0.10)
    assert verdict.adopts, verdict.why
