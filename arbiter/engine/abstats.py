"""The statistics of a paired ON/OFF run, pure.

Each block gives the protected program's progress rate with the work ON and OFF; d_i =
ln(ON_i / OFF_i).  The first blocks (the pilot) size the run and are then left out of R: using
them twice would let a lucky pilot both shorten the run and narrow its interval.  R =
exp(mean d) over the rest, with a drift-robust interval (90 %, or the look's when a run is
judged twice: :func:`look_confidence`): a machine drifts (clocks and
temperature settle, other load comes and goes), successive d are then correlated and a paired
t-interval is too narrow, so the interval assumes the lag-1 autocorrelation the blocks show
(bias-corrected, plus an allowance for its error) and widens by the variance of a mean of AR(1)
values; at an autocorrelation of 0 it is the paired t-interval.  Also Fieller's interval for the
ratio of the mean rates as a cross-check, a verdict against the margin (a certificate also needs
the effect over the run's first and last quarter to clear it, and no change of the effect during
the run), how many more blocks
would decide an inconclusive run, the pilot's sizing from the upper 80 % confidence limit of the
SD, the lag-1 autocorrelation of d and an order-effect check.  bench/ab_validity.py measures the
error rates under independent, heavy-tailed, drifting and trending blocks.

Quantiles come from the exact distributions (:mod:`arbiter.engine.quantiles`).

One module past 400 lines: the quantiles, the interval, the verdict and the sizing are one
calculation, which bench/ab_validity.py mirrors and judges as a whole.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

from arbiter.engine.quantiles import chi2_quantile, t_quantile

CONFIDENCE = 0.90
#: an inconclusive run that would need more blocks than this "will not be decided"
REALISTIC_BLOCKS = 200

Verdict = Literal[
    "no slowdown shown", "slowdown smaller than the margin", "slowdown", "inconclusive", "the effect changed"
]


@dataclass(frozen=True)
class Block:
    on: float  # progress rate with the work running (events/s over the measured part)
    off: float  # ... with the work paused or evicted
    on_first: bool = True  # the order inside the block


# --- a run ---------------------------------------------------------------------------------------

#: the drift allowance on the lag-1 autocorrelation: a flat part and a share of a positive
#: estimate, for the estimate's error (the variance of the mean grows faster than linearly in it)
DRIFT_FLAT = 0.015
DRIFT_SHARE = 0.20
#: the bounds of the autocorrelation an interval is built with
PHI_LOW, PHI_HIGH = -0.5, 0.9
#: the sizing plans this many times the blocks a paired t-interval would need (as far as the run's
#: hours allow): the drift-robust interval is wider on independent blocks too
ROBUST_ALLOWANCE = 2.0
#: the change statistic's critical value: the 95 % point of the largest excursion of a Brownian
#: bridge (Kolmogorov's distribution), which the statistic approaches on a stationary run
CHANGE_CRITICAL = 1.358
#: A certificate vouches for the effect throughout the run, not only for its mean: the effect
#: over the run's first and over its last blocks, this share of all of them (the pilot's in the
#: first), must each clear 1 − margin at the look's confidence too.  An effect that wanders in
#: steps smaller than the block noise is invisible to any change test, yet moves the run's mean
#: away from where it started; a quarter is short enough that it cannot move far within one.
#: bench/ab_validity.py measures it: a random walk from R = 1 − margin certifies at most 5 %.
END_SHARE = 0.25
#: The ends stop growing past this many blocks (a quarter of 48: 12 blocks each).  A longer run's
#: quarter would span more blocks, over which a wandering effect moves further from where the
#: run began than the end's interval allows for; bench/ab_window.py --hours-only measures the
#: walk from 1 − margin at longer --max-hours.
END_GROWS_TO = 48
#: Two looks.  A run is judged where its sizing planned it to end; one that is inconclusive there
#: with R above 1 − margin runs on to the blocks its hours leave and is judged again.  Each look
#: spends part of the error (the lower bound is one-sided at (1 − confidence) / 2): almost none at
#: the first, so that a second look costs little, most at the last (an O'Brien–Fleming-like split).
#: A run planned to its hours' end has one look at :data:`CONFIDENCE`.  bench/ab_validity.py
#: calibrates the pair: no cell certifies more than 5 % of runs at R = 1 − margin.
FIRST_LOOK_CONFIDENCE = 0.99
LAST_LOOK_CONFIDENCE = 0.91

Method = Literal["paired t", "drift-robust"]


@dataclass(frozen=True)
class Interval:
    """An interval for ln R from the mean and SD of ``m`` block differences, assuming their lag-1
    autocorrelation is ``phi`` (an AR(1) drift).  At ``phi`` = 0 it is the paired t-interval."""

    mean: float
    half: float  # the half-width on the log scale
    df: int  # of the t quantile
    vif: float  # the variance of the mean over that of independent blocks

    @property
    def low(self) -> float:
        return self.mean - self.half

    @property
    def high(self) -> float:
        return self.mean + self.half


def variance_factor(phi: float, m: int) -> float:
    """Var(mean of m AR(1) values) / (σ²/m): 1 + 2 Σ_k (1 − k/m) φ^k."""
    return 1 + 2 * sum((1 - k / m) * phi**k for k in range(1, m))


def interval(mean: float, sd: float, m: int, phi: float = 0.0, confidence: float = CONFIDENCE) -> Interval:
    """The interval at ``confidence`` for the mean of ``m`` differences with sample SD ``sd``.

    Under AR(1) drift the variance of the mean is σ²/m times :func:`variance_factor`, and the
    sample variance underestimates σ² by (m − vif)/(m − 1); the t quantile takes the blocks'
    effective number m / vif, less one, as its degrees of freedom."""
    if m < 2:
        raise ValueError("an interval needs at least 2 blocks")
    vif = variance_factor(phi, m)
    var = sd * sd / m * vif * (m - 1) / max(m - vif, 1.0)
    df = min(m - 1, max(1, math.floor(m / vif) - 1))
    return Interval(mean, t_quantile(1 - (1 - confidence) / 2, df) * math.sqrt(var), df, vif)


def lag1(d: Sequence[float]) -> float | None:
    """The lag-1 autocorrelation of ``d`` around its mean (None: fewer than 3 values or no spread)."""
    if len(d) < 3:
        return None
    m = _mean(d)
    dev = [x - m for x in d]
    ss = sum(x * x for x in dev)
    if ss == 0:
        return None
    return sum(dev[i] * dev[i + 1] for i in range(len(d) - 1)) / ss


def drift_phi(d: Sequence[float]) -> float:
    """The autocorrelation the interval assumes: the lag-1 estimate r of all ``n`` blocks, corrected
    for its small-sample bias (E r ≈ φ − (1 + 3φ)/n), plus the drift allowance, within bounds."""
    n = len(d)
    r = lag1(d)
    est = 0.0 if r is None or n < 4 else (n * r + 1) / (n - 3)
    phi = est + DRIFT_FLAT + DRIFT_SHARE * max(est, 0.0)
    return min(PHI_HIGH, max(PHI_LOW, phi))


def change_statistic(d: Sequence[float]) -> float | None:
    """How far the block differences wander from their mean: the largest |partial sum of
    d_i − mean d| over √(N · s² · the variance factor of the drift :func:`drift_phi` assumes).

    On a stationary run, drifting or not, it approaches the largest excursion of a Brownian
    bridge; an effect that shifts, trends or wanders during the run makes the partial sums run
    away from 0 (a CUSUM test of a change in level).  None: fewer than 4 blocks or no spread."""
    n = len(d)
    if n < 4:
        return None
    m, sd = _mean(d), _sd(d)
    if sd == 0:
        return None
    total, worst = 0.0, 0.0
    for x in d[:-1]:
        total += x - m
        worst = max(worst, abs(total))
    return worst / (sd * math.sqrt(n * variance_factor(drift_phi(d), n)))


def end_blocks(n: int) -> int:
    """The blocks each end of a run of ``n`` spans: :data:`END_SHARE` of them, of at most
    :data:`END_GROWS_TO`, at least 2."""
    return max(2, math.ceil(min(n, END_GROWS_TO) * END_SHARE))


def end_intervals(d: Sequence[float], phi: float, confidence: float = CONFIDENCE) -> tuple[Interval, Interval] | None:
    """Intervals for the mean effect over the first and over the last :func:`end_blocks` of the
    blocks ``d`` (every block, the pilot's included), assuming the autocorrelation ``phi``.

    Each is the drift-robust interval of its share's mean, but with the SD and the degrees of
    freedom of all the blocks (the SD is estimated from them all, and a share's own few would
    make the t quantile needlessly large); an effect that moved during the run also widens that
    SD.  None: fewer than 4 blocks or no spread."""
    n = len(d)
    if n < 4:
        return None
    sd = _sd(d)
    if sd == 0:
        return None
    k = end_blocks(n)
    whole = variance_factor(phi, n)
    part = variance_factor(phi, k)
    df = min(n - 1, max(1, math.floor(n / whole) - 1))
    half = t_quantile(1 - (1 - confidence) / 2, df) * math.sqrt(sd * sd / k * part * (n - 1) / max(n - whole, 1.0))
    return Interval(_mean(d[:k]), half, df, part), Interval(_mean(d[n - k :]), half, df, part)


@dataclass(frozen=True)
class Analysis:
    n: int  # blocks analysed (the pilot's are not)
    r: float  # exp(mean d) over the analysed blocks
    low: float  # the interval for R at 90 % the verdict uses
    high: float
    fieller: tuple[float, float] | None  # Fieller's interval for mean ON / mean OFF (None: unbounded)
    sd: float  # of d
    verdict: Verdict
    certifies: bool
    more_blocks: int | None  # for "inconclusive": about how many more would decide it (None: none realistic)
    lag1: float | None  # lag-1 autocorrelation of d, every block
    order_effect: float | None  # mean d with ON first minus mean d with OFF first
    order_effect_flag: bool  # that difference is larger than twice its standard error
    why: str
    method: Method = "drift-robust"
    method_why: str = ""
    pilot: int = 0  # the first blocks, which sized the run and are not in R or its interval
    phi: float = 0.0  # the autocorrelation the interval assumes
    widening: float = 1.0  # its half-width over the paired t-interval's
    t_low: float = 0.0  # the paired t-interval at 90 % on the same blocks (assumes them independent)
    t_high: float = 0.0
    change: float | None = None  # :func:`change_statistic` over every block
    #: R and its lower bound over the first and over the last :data:`END_SHARE` of every block
    ends: tuple[tuple[float, float], ...] | None = None
    end_blocks: int = 0  # the blocks each end spans
    ends_short: bool = False  # the interval would certify, but an end is not shown within the margin
    confidence: float = CONFIDENCE  # of the interval the verdict uses (the look's)


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


def _usual_high(robust: Interval, mean: float, sd: float, n: int, phi: float, confidence: float) -> float:
    """The upper bound a slowdown is shown by: the :data:`CONFIDENCE` interval's at every look,
    since a slowdown certifies nothing and so spends none of the error the looks split."""
    return math.exp(robust.high if confidence == CONFIDENCE else interval(mean, sd, n, phi).high)


def analyse(
    blocks: Sequence[Block], margin: float, pilot: int = 0, confidence: float = CONFIDENCE, *, ends: bool = True
) -> Analysis:
    """The verdict of a run's blocks against ``margin`` (e.g. 0.02: a 2 % slowdown is tolerated),
    from the interval at ``confidence`` (the look's: :data:`FIRST_LOOK_CONFIDENCE` …).

    The first ``pilot`` blocks sized the run: they count in the autocorrelation estimate but not
    in R or its interval, so the choice of the run's length cannot bias them.  ``ends``: whether
    the run's first and last quarter must clear the margin too, and the change test reads the
    pilot (a twin's confirmation, whose pilot is another node's blocks, leaves its ends to the
    run that earned the certificate and looks for a change in its own blocks alone)."""
    n_all = len(blocks)
    if pilot < 0 or n_all - pilot < 2:
        raise ValueError(f"an interval needs at least 2 blocks after the pilot of {pilot}; there are {n_all}")
    if any(b.on <= 0 or b.off <= 0 for b in blocks):
        raise ValueError("every rate must be above 0 (a block without progress is excluded, not analysed)")
    d_all = [math.log(b.on / b.off) for b in blocks]
    used = blocks[pilot:]
    d = d_all[pilot:]
    n = len(d)
    mean, sd = _mean(d), _sd(d)
    paired = interval(mean, sd, n, confidence=confidence)
    phi = drift_phi(d_all)
    robust = interval(mean, sd, n, phi, confidence)
    widening = robust.half / paired.half if paired.half > 0 else 1.0
    r_lag = lag1(d_all)
    method_why = (
        f"drift-robust: the interval assumes a lag-1 autocorrelation of {phi:+.2f} (estimated "
        f"{'n/a' if r_lag is None else f'{r_lag:+.2f}'} over {n_all} blocks, bias-corrected, plus an allowance"
        f" for its error), {widening:.2f} × the paired t-interval's width, on {robust.df} degrees of freedom"
    )
    r, low, high = math.exp(mean), math.exp(robust.low), math.exp(robust.high)
    floor = 1 - margin
    more: int | None = None
    if low >= floor:
        verdict: Verdict = "slowdown smaller than the margin" if high < 1 else "no slowdown shown"
        why = f"the lower bound {low:.4f} is at or above 1 − margin = {floor:.4f}"
    elif (usual_high := _usual_high(robust, mean, sd, n, phi, confidence)) < 1 and r < floor:
        verdict = "slowdown"
        why = f"the whole {CONFIDENCE * 100:g} % interval is below 1 (up to {usual_high:.4f}) and R = {r:.4f} is below {floor:.4f}"
    else:
        verdict = "inconclusive"
        gap = mean - math.log(floor)
        if gap <= 0 or robust.half == 0:
            why = f"R = {r:.4f} is not above {floor:.4f}: no realistic number of blocks will show no slowdown"
        else:
            # the half-width shrinks as 1/√blocks
            needed = math.ceil(n * (robust.half / gap) ** 2)
            if needed <= REALISTIC_BLOCKS:
                more = max(1, needed - n)
                why = f"about {more} more block(s) would decide it"
            else:
                why = f"it would take about {needed} blocks: no realistic run will decide it"
    change = change_statistic(d_all if ends else d)
    if verdict in ("no slowdown shown", "slowdown smaller than the margin") and (change or 0.0) > CHANGE_CRITICAL:
        # R is the mean of an effect that moved: where it ends may be far from that mean
        verdict = "the effect changed"
        why = (
            f"{why}, but the effect changed during the run (its change statistic {change:.2f} is above"
            f" {CHANGE_CRITICAL:g}): no certificate"
        )
    ends_at = end_intervals(d_all, phi, confidence) if ends else None
    ends_short = False
    if verdict in ("no slowdown shown", "slowdown smaller than the margin") and ends_at is not None:
        usual = (end_intervals(d_all, phi) if confidence != CONFIDENCE else None) or ends_at
        verdict, why, more = _judge_ends(ends_at, usual, math.log(floor), n_all, verdict, why)
        ends_short = verdict == "inconclusive"
    first = [x for x, b in zip(d, used, strict=True) if b.on_first]
    second = [x for x, b in zip(d, used, strict=True) if not b.on_first]
    effect, flag = None, False
    if len(first) >= 2 and len(second) >= 2:
        effect = _mean(first) - _mean(second)
        se = math.sqrt(_sd(first) ** 2 / len(first) + _sd(second) ** 2 / len(second))
        flag = se > 0 and abs(effect) > 2 * se
    t = t_quantile(1 - (1 - confidence) / 2, n - 1)
    return Analysis(
        n=n,
        r=r,
        low=low,
        high=high,
        fieller=fieller([b.on for b in used], [b.off for b in used], t),
        sd=sd,
        verdict=verdict,
        certifies=verdict in ("no slowdown shown", "slowdown smaller than the margin"),
        more_blocks=more,
        lag1=r_lag,
        order_effect=effect,
        order_effect_flag=flag,
        why=why,
        method="drift-robust",
        method_why=method_why,
        pilot=pilot,
        phi=phi,
        widening=widening,
        t_low=math.exp(paired.low),
        t_high=math.exp(paired.high),
        change=change,
        confidence=confidence,
        ends=None if ends_at is None else tuple((math.exp(e.mean), math.exp(e.low)) for e in ends_at),
        end_blocks=0 if ends_at is None else end_blocks(n_all),
        ends_short=ends_short,
    )


def _judge_ends(
    ends: tuple[Interval, Interval],
    usual: tuple[Interval, Interval],
    floor: float,
    n_all: int,
    verdict: Verdict,
    why: str,
) -> tuple[Verdict, str, int | None]:
    """A verdict that would certify, judged again on the effect at the run's ends (``ends`` at the
    look's confidence, ``usual`` at :data:`CONFIDENCE`; ``floor`` is ln(1 − margin)): kept where
    both ends' lower bounds clear it; "the effect changed" where an end's whole 90 % interval is
    below it (shown outside the margin, as a slowdown is shown, while the mean is shown inside);
    inconclusive otherwise, with about how many more blocks would show the ends (their
    half-widths shrink as 1/√blocks too, until the ends stop growing at :data:`END_GROWS_TO`)."""
    if all(e.low >= floor for e in ends):
        return verdict, why, None
    k = end_blocks(n_all)
    names = (f"first {k}", f"last {k}")
    shown = [i for i in range(2) if usual[i].high < floor]
    if shown:
        i = shown[0]
        return (
            "the effect changed",
            f"{why}, but over the run's {names[i]} blocks R = {math.exp(usual[i].mean):.4f}, its whole"
            f" {CONFIDENCE * 100:g} % interval below 1 − margin = {math.exp(floor):.4f} (up to"
            f" {math.exp(usual[i].high):.4f}): the effect changed during the run, no certificate",
            None,
        )
    worst = min(range(2), key=lambda i: ends[i].low)
    end = ends[worst]
    more = None
    # an end's half-width shrinks as 1/√blocks while the ends grow with the run, and no further
    needed = math.ceil(n_all * (end.half / (end.mean - floor)) ** 2) if end.mean > floor else None
    if needed is not None and needed <= min(REALISTIC_BLOCKS, END_GROWS_TO):
        more = max(1, needed - n_all)
    tail = f"about {more} more block(s) would decide it" if more else "no realistic run will decide it"
    return (
        "inconclusive",
        f"{why}, but over the run's {names[worst]} blocks R = {math.exp(end.mean):.4f}, its lower bound"
        f" {math.exp(end.low):.4f} below 1 − margin (a certificate vouches for the effect at the run's start and end"
        f" too): {tail}",
        more,
    )


def look_confidence(looked: int, target: int, most: int) -> float:
    """The confidence of a run's interval: ``looked`` the blocks at its first look (0: none yet),
    ``target`` the blocks it plans, ``most`` the most its hours allow."""
    if looked:
        return LAST_LOOK_CONFIDENCE
    return FIRST_LOOK_CONFIDENCE if target < most else CONFIDENCE


def runs_on(a: Analysis, margin: float) -> bool:
    """A first look that decided nothing but whose R is above 1 − margin: the run goes on to its
    last look (one at or below it already looks slowed, and its hours are not spent on it)."""
    return a.verdict == "inconclusive" and a.r > 1 - margin


def _settled(sd_upper: float, gap: float, allowance: float) -> int:
    """The fewest blocks m with m ≥ allowance · (t(m − 1) · sd_upper / gap)² (at least 2; past
    10 × the realistic count, the first m found there).  No m below the same bound with the
    normal quantile qualifies, since t is above it; from there m grows until t has shrunk enough."""
    z = NormalDist().inv_cdf(1 - (1 - CONFIDENCE) / 2)
    m = max(2, math.ceil(allowance * (z * sd_upper / gap) ** 2))
    while m <= 10 * REALISTIC_BLOCKS:
        t = t_quantile(1 - (1 - CONFIDENCE) / 2, m - 1)
        if m >= allowance * (t * sd_upper / gap) ** 2:
            break
        m += 1
    return m


def blocks_needed(pilot: Sequence[Block], margin: float, most: int | None = None) -> int | None:
    """From a pilot (the first blocks), how many blocks after it a run needs for a program that is
    not slowed to show it, sizing with the upper 80 % confidence limit of the SD: what a paired
    t-interval would need, times :data:`ROBUST_ALLOWANCE` for the drift-robust interval, the
    allowance trimmed to ``most`` (the blocks the run's hours leave after the pilot).  None when
    not even the paired t-interval's count is realistic; above ``most`` when only it is."""
    n = len(pilot)
    if n < 2:
        raise ValueError("a pilot needs at least 2 blocks")
    sd = _sd([math.log(b.on / b.off) for b in pilot])
    sd_upper = sd * math.sqrt((n - 1) / chi2_quantile(0.20, n - 1))
    gap = -math.log(1 - margin)
    bare = _settled(sd_upper, gap, 1.0)
    if bare > REALISTIC_BLOCKS:
        return None
    cap = REALISTIC_BLOCKS if most is None else min(most, REALISTIC_BLOCKS)
    return min(_settled(sd_upper, gap, ROBUST_ALLOWANCE), max(bare, cap))


def planned_hours(blocks: int, window_s: float) -> float:
    """Each block is two windows (each window's washout is its own first seconds)."""
    return blocks * 2 * window_s / 3600


def blocks_within(max_hours: float, window_s: float) -> int:
    """The most blocks whose :func:`planned_hours` is within ``max_hours``."""
    b = max(0, math.floor(max_hours / planned_hours(1, window_s)))
    while planned_hours(b + 1, window_s) <= max_hours:
        b += 1
    while b > 0 and planned_hours(b, window_s) > max_hours:
        b -= 1
    return b
