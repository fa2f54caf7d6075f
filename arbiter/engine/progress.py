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

    Two things end what came before: a count that falls (the program started again from
    zero) and a count that stood still for more than a whole window before it moved again
    (the program was idle, or not running) and has moved since: the rate then counts from the
    first sample after it, as for a source just opened, rather than averaging the idle time in.
    """
    if not samples:
        return None
    start = now - window_s
    first = 0
    for i in range(1, len(samples)):
        if samples[i][1] < samples[i - 1][1]:
            first = i
    at = first
    for i in range(first + 1, len(samples)):
        if samples[i][0] <= start:
            at = i
        else:
            break
    # moved again at least twice: a program whose every step takes longer than the window
    # keeps its slow rate rather than none
    if at + 2 < len(samples) and samples[at][0] <= start and samples[at + 1][0] - samples[at][0] > window_s:
        at += 1
    anchor = samples[at]
    span = now - anchor[0]
    if span < min_span_s:
        return None
    return max(0, samples[-1][1] - anchor[1]) / span
