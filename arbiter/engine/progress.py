"""A progress rate from a source's cumulative counts (pure: samples and a time in, a rate out)."""

from __future__ import annotations

from collections.abc import Sequence

#: (monotonic time, cumulative count)
Sample = tuple[float, int]


def rate(samples: Sequence[Sample], now: float, window_s: float, min_span_s: float = 1.0) -> float | None:
    """Events per second over the last ``window_s`` before ``now``.

    Counts are cumulative, so the rate is the count gained since the last sample at or
    before the window's start (the oldest sample when none is that old), over the time
    since that sample.  None while that spans less than ``min_span_s``.
    """
    if not samples:
        return None
    start = now - window_s
    anchor = samples[0]
    for sample in samples:
        if sample[0] <= start:
            anchor = sample
        else:
            break
    span = now - anchor[0]
    if span < min_span_s:
        return None
    return max(0, samples[-1][1] - anchor[1]) / span
