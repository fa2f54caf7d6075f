"""The benches' percentile."""

from __future__ import annotations

from arbiter_testing.reaction import percentile


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.99) == 99.0  # not the slowest of a hundred
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 1.0) == 100.0
    assert percentile([3.0, 1.0, 2.0], 0.99) == 3.0
    assert percentile([5.0], 0.5) == 5.0
