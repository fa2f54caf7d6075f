"""The statistics of a paired ON/OFF run, pure.

Each block gives the protected program's progress rate with the work ON and OFF; d_i =
ln(ON_i / OFF_i).  R = exp(mean d) with a paired t-interval at 90 %, Fieller's interval for
the ratio of the mean rates as a cross-check, a verdict against the margin, how many more
blocks would decide an inconclusive run, the pilot's sizing from the upper 80 % confidence
limit of the SD, the lag-1 autocorrelation of d and an order-effect check.

Quantiles come from the exact distributions, integrated here: no statistics library needed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

CONFIDENCE = 0.90
#: an inconclusive run that would need more blocks than this "will not be decided"
REALISTIC_BLOCKS = 200

Verdict = Literal["no slowdown shown", "slowdown smaller than the margin", "slowdown", "inconclusive"]


@dataclass(frozen=True)
class Block:
    on: float  # progress rate with the work running (events/s over the measured part)
    off: float  # ... with the work paused or evicted
    on_first: bool = True  # the order inside the block


# --- distributions -----------------------------------------------------------------------------


def _t_cdf(x: float, nu: float) -> float:
    """Student's t CDF (Simpson's rule on the density: exact enough for quantiles)."""
    if x == 0:
        return 0.5
    log_c = math.lgamma((nu + 1) / 2) - math.lgamma(nu / 2) - 0.5 * math.log(nu * math.pi)
    steps = 400  # Simpson: the density is smooth, its error is far below what a quantile needs
    h = abs(x) / steps
    total = 0.0
    for i in range(steps + 1):
        u = i * h
        w = 1 if i in (0, steps) else (4 if i % 2 else 2)
        total += w * math.exp(log_c - (nu + 1) / 2 * math.log1p(u * u / nu))
    area = total * h / 3
    return 0.5 + area if x > 0 else 0.5 - area


def t_quantile(p: float, nu: float) -> float:
    """The ``p`` quantile of Student's t with ``nu`` degrees of freedom."""
    if not 0 < p < 1 or nu <= 0:
        raise ValueError("need 0 < p < 1 and nu > 0")
    if p < 0.5:
        return -t_quantile(1 - p, nu)
    return _invert(lambda x: _t_cdf(x, nu), p, 1.0)


def _invert(cdf: Callable[[float], float], p: float, hi: float) -> float:
    """The x ≥ 0 where an increasing ``cdf`` reaches ``p``, by bisection."""
    lo = 0.0
    while cdf(hi) < p:
        hi *= 2
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def _chi2_cdf(x: float, k: float) -> float:
    """The chi-square CDF: the regularized lower incomplete gamma P(k/2, x/2), by its series."""
    if x <= 0:
        return 0.0
    s, z = k / 2, x / 2
    term = 1.0 / s
    total = term
    n = 1
    while term > total * 1e-15 and n < 10_000:
        term *= z / (s + n)
        total += term
        n += 1
    return math.exp(s * math.log(z) - z - math.lgamma(s)) * total


def chi2_quantile(p: float, k: float) -> float:
    if not 0 < p < 1 or k <= 0:
        raise ValueError("need 0 < p < 1 and k > 0")
    return _invert(lambda x: _chi2_cdf(x, k), p, max(1.0, k))


# --- a run ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Analysis:
    n: int
    r: float  # exp(mean d)
    low: float  # the paired t-interval for R at 90 %
    high: float
    fieller: tuple[float, float] | None  # Fieller's interval for mean ON / mean OFF (None: unbounded)
    sd: float  # of d
    verdict: Verdict
    certifies: bool
    more_blocks: int | None  # for "inconclusive": about how many more would decide it (None: none realistic)
    lag1: float | None  # lag-1 autocorrelation of d
    order_effect: float | None  # mean d with ON first minus mean d with OFF first
    order_effect_flag: bool  # that difference is larger than twice its standard error
    why: str


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _sd(xs: Sequence[float]) -> float:
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def fieller(on: Sequence[float], off: Sequence[float], t: float) -> tuple[float, float] | None:
    """Fieller's interval for mean(on) / mean(off), paired samples."""
    n = len(on)
    a, b = _mean(on), _mean(off)
    v_aa = sum((x - a) ** 2 for x in on) / (n - 1) / n
    v_bb = sum((y - b) ** 2 for y in off) / (n - 1) / n
    v_ab = sum((x - a) * (y - b) for x, y in zip(on, off, strict=True)) / (n - 1) / n
    qa = b * b - t * t * v_bb
    if qa <= 0:
        return None  # the denominator is not clearly away from 0: the interval is unbounded
    qb = -2 * (a * b - t * t * v_ab)
    qc = a * a - t * t * v_aa
    disc = qb * qb - 4 * qa * qc
    if disc < 0:
        return None
    root = math.sqrt(disc)
    return ((-qb - root) / (2 * qa), (-qb + root) / (2 * qa))


def analyse(blocks: Sequence[Block], margin: float) -> Analysis:
    """The verdict of a run's blocks against ``margin`` (e.g. 0.02: a 2 % slowdown is tolerated)."""
    n = len(blocks)
    if n < 2:
        raise ValueError("a paired t-interval needs at least 2 blocks")
    if any(b.on <= 0 or b.off <= 0 for b in blocks):
        raise ValueError("every rate must be above 0 (a block without progress is excluded, not analysed)")
    d = [math.log(b.on / b.off) for b in blocks]
    mean, sd = _mean(d), _sd(d)
    t = t_quantile(1 - (1 - CONFIDENCE) / 2, n - 1)
    half = t * sd / math.sqrt(n)
    r, low, high = math.exp(mean), math.exp(mean - half), math.exp(mean + half)
    floor = 1 - margin
    more: int | None = None
    if low >= floor:
        verdict: Verdict = "slowdown smaller than the margin" if high < 1 else "no slowdown shown"
        why = f"the lower bound {low:.4f} is at or above 1 − margin = {floor:.4f}"
    elif high < 1 and r < floor:
        verdict, why = "slowdown", f"the whole interval is below 1 and R = {r:.4f} is below {floor:.4f}"
    else:
        verdict = "inconclusive"
        gap = math.log(r) - math.log(floor)
        if gap <= 0 or sd == 0:
            why = f"R = {r:.4f} is not above {floor:.4f}: no realistic number of blocks will show no slowdown"
        else:
            needed = math.ceil((t * sd / gap) ** 2)
            if needed <= REALISTIC_BLOCKS:
                more = max(1, needed - n)
                why = f"about {more} more block(s) would decide it"
            else:
                why = f"it would take about {needed} blocks: no realistic run will decide it"
    lag1 = None
    if n >= 3 and sd > 0:
        dev = [x - mean for x in d]
        lag1 = sum(dev[i] * dev[i + 1] for i in range(n - 1)) / sum(x * x for x in dev)
    first = [x for x, b in zip(d, blocks, strict=True) if b.on_first]
    second = [x for x, b in zip(d, blocks, strict=True) if not b.on_first]
    effect, flag = None, False
    if len(first) >= 2 and len(second) >= 2:
        effect = _mean(first) - _mean(second)
        se = math.sqrt(_sd(first) ** 2 / len(first) + _sd(second) ** 2 / len(second))
        flag = se > 0 and abs(effect) > 2 * se
    return Analysis(
        n=n,
        r=r,
        low=low,
        high=high,
        fieller=fieller([b.on for b in blocks], [b.off for b in blocks], t),
        sd=sd,
        verdict=verdict,
        certifies=verdict in ("no slowdown shown", "slowdown smaller than the margin"),
        more_blocks=more,
        lag1=lag1,
        order_effect=effect,
        order_effect_flag=flag,
        why=why,
    )


def blocks_needed(pilot: Sequence[Block], margin: float) -> int | None:
    """From a pilot (the first blocks), how many blocks a run needs for a program that is not
    slowed to show it, sizing with the upper 80 % confidence limit of the SD; None when no
    realistic number will."""
    n = len(pilot)
    if n < 2:
        raise ValueError("a pilot needs at least 2 blocks")
    sd = _sd([math.log(b.on / b.off) for b in pilot])
    sd_upper = sd * math.sqrt((n - 1) / chi2_quantile(0.20, n - 1))
    gap = -math.log(1 - margin)
    needed = n
    for _ in range(20):  # t depends on the n it sizes: settle it
        t = t_quantile(1 - (1 - CONFIDENCE) / 2, max(1, needed - 1))
        new = max(n, math.ceil((t * sd_upper / gap) ** 2))
        if new == needed:
            break
        needed = new
    return needed if needed <= REALISTIC_BLOCKS else None


def planned_hours(blocks: int, window_s: float) -> float:
    """Each block is two windows (each window's washout is its own first seconds)."""
    return blocks * 2 * window_s / 3600
