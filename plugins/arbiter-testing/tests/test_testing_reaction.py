"""The benches' percentile, and an interval for the change of one."""

from __future__ import annotations

import random

from arbiter_testing.reaction import difference_interval, percentile


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.99) == 99.0  # not the slowest of a hundred
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 1.0) == 100.0
    assert percentile([3.0, 1.0, 2.0], 0.99) == 3.0
    assert percentile([5.0], 0.5) == 5.0


def test_the_interval_of_a_difference_holds_it_and_excludes_zero_only_for_a_real_one() -> None:
    rng = random.Random(7)
    same = [rng.expovariate(1.0) for _ in range(400)]
    other = [rng.expovariate(1.0) for _ in range(400)]
    lo, hi = difference_interval(same, other, 0.5, random.Random(1))
    assert lo < 0.0 < hi  # two draws of one distribution
    shifted = [v + 3.0 for v in other]
    lo, hi = difference_interval(same, shifted, 0.5, random.Random(1))
    assert 2.0 < lo <= 3.0 <= hi < 4.0
    assert difference_interval(same, shifted, 0.5, random.Random(1)) == (lo, hi)  # the seed decides it


def test_a_wider_level_gives_a_wider_interval() -> None:
    values = [float(v % 37) for v in range(300)]
    narrow = difference_interval(values, values, 0.9, random.Random(3), level=0.5)
    wide = difference_interval(values, values, 0.9, random.Random(3), level=0.99)
    assert wide[0] <= narrow[0] <= narrow[1] <= wide[1]


def test_over_floors_a_change_the_box_made_alone_is_taken_out_and_one_of_its_own_stays() -> None:
    rng = random.Random(11)
    box = [rng.expovariate(2.0) for _ in range(400)]
    ours = [rng.expovariate(2.0) for _ in range(400)]
    floor_before, floor_after = box, [v + 1.5 for v in box]  # the box got slower
    before, after = [v + 1.0 for v in ours], [v + 2.5 for v in ours]  # by as much
    assert difference_interval(before, after, 0.5, random.Random(1))[0] > 1.0
    lo, hi = difference_interval(before, after, 0.5, random.Random(1), floors=(floor_before, floor_after))
    assert lo < 0.0 < hi
    lo, hi = difference_interval(
        before, [v + 1.0 for v in after], 0.5, random.Random(1), floors=(floor_before, floor_after)
    )
    assert 0.5 < lo <= 1.0 <= hi < 1.5  # a second more than the box's own change
