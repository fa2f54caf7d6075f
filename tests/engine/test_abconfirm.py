"""A twin's confirmation: sized from the original run's blocks, judged on its own, refused
when it disagrees with the original or does not confirm it."""

from __future__ import annotations

import math
import random

from arbiter.engine import abconfirm
from arbiter.engine.abstats import Block


def blocks(r: float, sd: float, n: int, seed: int = 1) -> list[Block]:
    rng = random.Random(seed)
    return [Block(100.0 * math.exp(math.log(r) + rng.gauss(0, sd)), 100.0, i % 2 == 0) for i in range(n)]


def test_a_confirmation_is_sized_from_the_original_and_never_below_the_minimum() -> None:
    quiet = abconfirm.blocks_for(blocks(1.0, 0.001, 16), 0.02)
    assert quiet == abconfirm.MIN_BLOCKS
    noisy = abconfirm.blocks_for(blocks(1.0, 0.02, 16), 0.02)
    assert noisy is not None and noisy > abconfirm.MIN_BLOCKS
    assert abconfirm.blocks_for(blocks(1.0, 0.5, 16), 0.02) is None  # no realistic run confirms it
    assert abconfirm.blocks_for(blocks(1.0, 0.01, 1), 0.02) is None


def test_a_confirmation_that_shows_no_slowdown_adopts() -> None:
    j = abconfirm.judge(0.99, 1.01, blocks(1.0, 0.003, 8, seed=2), 0.02)
    assert j.adopts and "confirmed here over 8 blocks" in j.why


def test_a_confirmation_slowed_beyond_the_original_disagrees() -> None:
    j = abconfirm.judge(0.99, 1.01, blocks(0.9, 0.003, 8), 0.02)
    assert j.outcome == "disagrees" and not j.adopts and "slowed more on this node" in j.why


def test_an_inconclusive_confirmation_does_not_confirm() -> None:
    j = abconfirm.judge(0.95, 1.01, blocks(0.985, 0.02, 6, seed=3), 0.02)
    assert j.outcome == "not confirmed" and "below 1 − margin" in j.why, j
