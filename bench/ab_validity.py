"""Does the paired ON/OFF procedure keep its promises?  A simulation of the whole run as the
harness does it: pilot, sizing, refusal, the remaining blocks, the verdict.

    uv run python bench/ab_validity.py [--runs 10000] [--workers 2] [--seed 20250] [--margin 0.02]

(about 40 s at the default 10,000 runs per cell on 2 busy cores; ``--runs 2000`` to iterate)

1. A pilot of 4 blocks, each giving d_i = ln(ON_i / OFF_i).
2. n = what ``abstats.blocks_needed`` says for the pilot; the run totals max(--blocks, 4 + n)
   blocks.  A run whose n is None, or whose planned hours exceed --max-hours, is refused after
   the pilot (it never certifies; its 4 pilot blocks are what it used).
3. The remaining blocks are run and analysed as ``abstats.analyse`` does: the pilot only in the
   autocorrelation estimate, the rest in R and its drift-robust interval, and the verdict; a
   certificate is withheld when the change statistic over every block says the effect moved.
4. Two looks, as ``abrun`` does: a run that ends before its hours' last block is judged at
   ``abstats.FIRST_LOOK_CONFIDENCE``; inconclusive there with R above 1 − margin, it runs on to
   the most blocks --max-hours allows and is judged again at ``LAST_LOOK_CONFIDENCE``.  A run
   sized to that most has one look at ``CONFIDENCE`` (90 %).

Grid: true R in {1.00, 0.99, 0.98, 0.97} × SD of d in {0.01, 0.02, 0.05} × noise models:
``gaussian``; ``t3`` (Student t, 3 degrees of freedom, scaled to the SD: heavy tails);
``ar1-0.3``, ``ar1-0.5``, ``ar1-0.7`` (d autocorrelated with that phi, marginal SD the given one:
drift across blocks); ``trend`` (gaussian, plus a linear trend on ON: d moves by 2 SD over the 12
planned blocks, and keeps moving in a longer run; the true R is its value at the middle of the
analysed blocks, which the run's mean estimates); ``order`` (gaussian, plus ±SD/2 depending on
whether the block ran ON or OFF first, by a fair coin).  Then models in which the effect itself
moves, starting at the cell's R, with gaussian block noise of the given SD: ``walk-S`` (a random
walk, each block's step gaussian with SD S × the block SD, S in 0.1, 0.25, 0.5), ``shift`` (R ·
e^0.02 until a block drawn from 8…24, R · e^−0.02 after) and ``sine`` (R · e^(0.02 sin(2π block /
48 + a random phase))).  There a run's true R is the mean effect over its analysed blocks, and a
certificate is false when the effect over the second half of them, the latest it vouches for,
was at or below 1 − margin on average.

Per cell: coverage for the true R, over the runs that were not refused, of the interval the
verdict used (99 % at a first look, 91 % at the last, 90 % at a run's only look; goal ≥ 0.85, and
≥ 0.88 for independent blocks) and of the 90 % interval at the run's end (0.88–0.92 for
independent blocks, the calibration of a single look; where a run stops depends on its data, so
it may read a little under), P(certify), P(slowdown), P(refused), P(ext) (the run went on past its
first look) and the blocks used.  Then the false certification rate at R = 1 − margin (goal ≤
0.05 in every cell; where the effect moves, in every cell), how often the change test withholds
where nothing moves, P(certify) at R = 1 (goal ≥ 0.80 at SD 0.02, gaussian, and under AR(1) drift
with phi = 0.5, within the run's hours), and the price of robustness: the analysed blocks the drift-robust interval needs for a power of 0.80 at R = 1, SD 0.02, against
the paired t-interval on independent blocks, and under AR(1) drift with phi = 0.5.

Everything is vectorised over replicates; the only Python loops run over blocks (to build the
AR(1) series) and over the few distinct block counts a cell's runs end with.

One file past 400 lines: a bench script is run by its path, and the vectorised procedure must
sit beside the report that judges it.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import sys
import time
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

from arbiter.engine import abconfirm, abstats

RATIOS = (1.00, 0.99, 0.98, 0.97)
SDS = (0.01, 0.02, 0.05)
STATIONARY = ("gaussian", "t3", "ar1-0.3", "ar1-0.5", "ar1-0.7", "trend", "order")
#: the effect itself moves: a random walk (steps of that share of the block SD), a level shift,
#: a slow sinusoid; each starts at the cell's R
MOVING = ("walk-0.1", "walk-0.25", "walk-0.5", "shift", "sine")
NOISES = STATIONARY + MOVING
INDEPENDENT = ("gaussian", "t3", "order")
MARGIN = 0.02
PILOT_BLOCKS = 4
PLANNED_BLOCKS = 12
WINDOW_S = 300.0
WASHOUT_S = 60.0
MAX_HOURS = 8.0
#: the trend model: d moves by this many SDs over the planned blocks
TREND_SDS = 2.0
#: the level shift: the effect is R · e^SHIFT until a block drawn from SHIFT_BLOCKS, R · e^−SHIFT after
SHIFT = 0.02
SHIFT_BLOCKS = (8, 24)
#: the sinusoid: R · e^(SINE · sin(2π block / SINE_PERIOD + a random phase))
SINE = 0.02
SINE_PERIOD = 48
COVERAGE_GOAL = (0.88, 0.92)
COVERAGE_FLOOR = 0.85
FALSE_CERT_GOAL = 0.05
POWER_GOAL = 0.80

# verdict codes, indexing abstats's verdict names; REFUSED: stopped after the pilot
VERDICTS: tuple[abstats.Verdict, ...] = (
    "no slowdown shown",
    "slowdown smaller than the margin",
    "slowdown",
    "inconclusive",
    "the effect changed",
)
NO_SLOWDOWN, SMALLER, SLOWDOWN, INCONCLUSIVE, CHANGED = range(5)
REFUSED = -1

_TWO_SIDED = 1 - (1 - abstats.CONFIDENCE) / 2
# the t quantile's limit as df grows: no t quantile is below it, which bounds the sizing from below
_Z = NormalDist().inv_cdf(_TWO_SIDED)
_T_CACHE: dict[tuple[float, int], float] = {}


def t_quantile(df: int, confidence: float = abstats.CONFIDENCE) -> float:
    """abstats's own two-sided t quantile, so the numbers match it exactly; cached because its
    quadrature costs milliseconds and a cell asks for the same few df thousands of times."""
    if (confidence, df) not in _T_CACHE:
        _T_CACHE[confidence, df] = abstats.t_quantile(1 - (1 - confidence) / 2, df)
    return _T_CACHE[confidence, df]


def t_quantiles(df: np.ndarray, confidence: float = abstats.CONFIDENCE) -> np.ndarray:
    uniq, inverse = np.unique(df, return_inverse=True)
    return np.array([t_quantile(int(k), confidence) for k in uniq])[inverse].reshape(df.shape)


def generate_d(
    noise: str,
    r: float,
    sd: float,
    replicates: int,
    blocks: int,
    rng: np.random.Generator,
    planned_blocks: int = PLANNED_BLOCKS,
) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
    """d (replicates × blocks) around ln r with SD ``sd`` under ``noise``, each block's order (True:
    ON first), the trend's slope per block (0 but for ``trend``: :func:`run_procedure` centres
    it on each run's analysed blocks) and the true ln R of each block (the effect; it moves under
    :data:`MOVING`).  The order is drawn for every model, as the harness always randomises it."""
    shape = (replicates, blocks)
    on_first = rng.random(shape) < 0.5
    slope = 0.0
    path = np.full(shape, math.log(r))
    if noise in MOVING:
        eps = sd * rng.standard_normal(shape)
        if noise.startswith("walk-"):
            steps = float(noise.removeprefix("walk-")) * sd * rng.standard_normal(shape)
            steps[:, 0] = 0.0
            path += np.cumsum(steps, axis=1)
        elif noise == "shift":
            at = rng.integers(SHIFT_BLOCKS[0], SHIFT_BLOCKS[1] + 1, size=replicates)[:, None]
            path += np.where(np.arange(blocks)[None, :] < at, SHIFT, -SHIFT)
        else:
            phase = rng.uniform(0, 2 * math.pi, size=replicates)[:, None]
            path += SINE * np.sin(2 * math.pi * np.arange(blocks)[None, :] / SINE_PERIOD + phase)
        return path + eps, on_first, slope, path
    if noise in ("gaussian", "trend"):
        eps = sd * rng.standard_normal(shape)
        if noise == "trend":
            slope = TREND_SDS * sd / max(1, planned_blocks - 1)
            eps += slope * np.arange(blocks)
    elif noise == "t3":
        eps = sd / math.sqrt(3.0) * rng.standard_t(3, shape)  # t with 3 df has variance 3
    elif noise.startswith("ar1-"):
        phi = float(noise.removeprefix("ar1-"))
        innovations = rng.standard_normal(shape)
        eps = np.empty(shape)
        eps[:, 0] = sd * innovations[:, 0]  # started stationary, so every block has the SD asked
        scale = sd * math.sqrt(1 - phi * phi)
        for j in range(1, blocks):
            eps[:, j] = phi * eps[:, j - 1] + scale * innovations[:, j]
    elif noise == "order":
        eps = sd * rng.standard_normal(shape) + np.where(on_first, sd / 2, -sd / 2)
    else:
        raise ValueError(f"unknown noise model {noise!r}; known: {', '.join(NOISES)}")
    return math.log(r) + eps, on_first, slope, path


def _row_mean_sd(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # the same two-pass formula as abstats._sd, so the last bits agree as closely as they can
    n = d.shape[1]
    mean = d.sum(axis=1) / n
    sd = np.sqrt(((d - mean[:, None]) ** 2).sum(axis=1) / (n - 1))
    return mean, sd


def _settle(sd_upper: np.ndarray, gap: float, allowance: float) -> np.ndarray:
    """``abstats._settled`` for each SD limit."""
    top = 10 * abstats.REALISTIC_BLOCKS
    needed = np.maximum(2, np.ceil(allowance * (_Z * sd_upper / gap) ** 2)).astype(np.int64)
    active = needed <= top
    while active.any():
        rows = np.flatnonzero(active)
        t = t_quantiles(needed[rows] - 1)
        ok = needed[rows] >= allowance * (t * sd_upper[rows] / gap) ** 2
        grow = rows[~ok]
        needed[grow] += 1
        active[:] = False
        active[grow[needed[grow] <= top]] = True
    return needed


def size_runs(pilot_d: np.ndarray, margin: float, most: int | None = None) -> np.ndarray:
    """``abstats.blocks_needed`` for each row of pilot d's (blocks after the pilot, the allowance
    trimmed to ``most``); 0 where it would say None."""
    n = pilot_d.shape[1]
    if n < 2:
        raise ValueError("a pilot needs at least 2 blocks")
    _, sd = _row_mean_sd(pilot_d)
    sd_upper = sd * math.sqrt((n - 1) / abstats.chi2_quantile(0.20, n - 1))
    gap = -math.log(1 - margin)
    cap = abstats.REALISTIC_BLOCKS
    # The answer is at least (z·sd_upper/gap)²: far above the cap it is None whatever t does, so
    # those rows skip the search and never ask for quantiles at huge df.
    hopeless = (_Z * sd_upper / gap) ** 2 > 10 * cap
    bare = np.full(sd_upper.shape, 10 * cap + 1, dtype=np.int64)
    allowed = bare.copy()
    rows = np.flatnonzero(~hopeless)
    bare[rows] = _settle(sd_upper[rows], gap, 1.0)
    allowed[rows] = _settle(sd_upper[rows], gap, abstats.ROBUST_ALLOWANCE)
    limit = cap if most is None else min(most, cap)
    needed = np.minimum(allowed, np.maximum(bare, limit))
    return np.where(bare > cap, 0, needed)


def drift_phi(d: np.ndarray) -> np.ndarray:
    """``abstats.drift_phi`` for each row of d (all its blocks, the pilot's included)."""
    n = d.shape[1]
    if n < 3:
        return np.full(d.shape[0], max(abstats.PHI_LOW, min(abstats.PHI_HIGH, abstats.DRIFT_FLAT)))
    dev = d - (d.sum(axis=1) / n)[:, None]
    ss = (dev * dev).sum(axis=1)
    lag = (dev[:, :-1] * dev[:, 1:]).sum(axis=1) / np.where(ss > 0, ss, 1.0)
    est = np.where(ss > 0, (n * lag + 1) / (n - 3), 0.0) if n >= 4 else np.zeros(d.shape[0])
    phi = est + abstats.DRIFT_FLAT + abstats.DRIFT_SHARE * np.maximum(est, 0.0)
    return np.clip(phi, abstats.PHI_LOW, abstats.PHI_HIGH)


def variance_factor(phi: np.ndarray, m: int) -> np.ndarray:
    """``abstats.variance_factor`` for each phi."""
    k = np.arange(1, m)
    factor: np.ndarray = 1 + 2 * ((1 - k / m)[None, :] * phi[:, None] ** k[None, :]).sum(axis=1)
    return factor


def change_statistic(d: np.ndarray) -> np.ndarray:
    """``abstats.change_statistic`` for each row of d (every block, the pilot's included)."""
    n = d.shape[1]
    mean, sd = _row_mean_sd(d)
    partial = np.abs(np.cumsum(d - mean[:, None], axis=1)[:, :-1]).max(axis=1)
    scale = sd * np.sqrt(n * variance_factor(drift_phi(d), n))
    return np.where(sd > 0, partial / np.where(sd > 0, scale, 1.0), 0.0)


def analyse_fixed(
    d: np.ndarray,
    margin: float,
    pilot: int = 0,
    *,
    robust: bool = True,
    change_test: bool = True,
    confidence: float = abstats.CONFIDENCE,
) -> dict[str, np.ndarray]:
    """``abstats.analyse`` for each row of d (all rows the same number of blocks, the first
    ``pilot`` of them left out of R): R, the 90 % interval and the verdict code.  ``robust``
    False: the paired t-interval instead, the procedure without its drift allowance;
    ``change_test`` False: without withholding a certificate when the effect changed."""
    m = d.shape[1] - pilot
    if m < 2:
        raise ValueError("an interval needs at least 2 blocks after the pilot")
    mean, sd = _row_mean_sd(d[:, pilot:])
    if robust:
        vif = variance_factor(drift_phi(d), m)
        var = sd * sd / m * vif * (m - 1) / np.maximum(m - vif, 1.0)
        df = np.minimum(m - 1, np.maximum(1, np.floor(m / vif) - 1)).astype(np.int64)
        half = t_quantiles(df, confidence) * np.sqrt(var)
        usual = t_quantiles(df) * np.sqrt(var)
    else:
        half = t_quantile(m - 1, confidence) * sd / math.sqrt(m)
        usual = t_quantile(m - 1) * sd / math.sqrt(m) * np.ones_like(mean)
    r, low, high = np.exp(mean), np.exp(mean - half), np.exp(mean + half)
    floor = 1 - margin
    verdict = np.full(d.shape[0], INCONCLUSIVE, dtype=np.int64)
    verdict[(mean + usual < 0) & (r < floor)] = SLOWDOWN  # at 90 % whatever the look: it certifies nothing
    certifies = low >= floor  # abstats tests this first, so it overrides a slowdown
    verdict[certifies] = np.where(high[certifies] < 1, SMALLER, NO_SLOWDOWN)
    if change_test and d.shape[1] >= 4:
        verdict[certifies & (change_statistic(d) > abstats.CHANGE_CRITICAL)] = CHANGED
    # the interval at the usual 90 % too, whose coverage the report judges whatever the look
    return {
        "r": r,
        "low": low,
        "high": high,
        "verdict": verdict,
        "low90": np.exp(mean - usual),
        "high90": np.exp(mean + usual),
    }


def affordable_blocks(window_s: float, washout_s: float, max_hours: float, limit: int) -> np.ndarray:
    """For each total 0..limit, whether its planned hours fit within ``max_hours``: asked of
    abstats.planned_hours itself rather than solved, so the refusal is the harness's."""
    return np.array([abstats.planned_hours(b, window_s) <= max_hours for b in range(limit + 1)])


def most_blocks(
    planned_blocks: int = PLANNED_BLOCKS,
    window_s: float = WINDOW_S,
    washout_s: float = WASHOUT_S,
    max_hours: float = MAX_HOURS,
) -> int:
    """The most blocks a run that is not refused can total: how many to simulate."""
    limit = max(planned_blocks, abstats.REALISTIC_BLOCKS)
    fits = np.flatnonzero(affordable_blocks(window_s, washout_s, max_hours, limit))
    return int(fits.max()) if fits.size else 0


def run_procedure(
    d: np.ndarray,
    margin: float = MARGIN,
    *,
    pilot_blocks: int = PILOT_BLOCKS,
    planned_blocks: int = PLANNED_BLOCKS,
    window_s: float = WINDOW_S,
    washout_s: float = WASHOUT_S,
    max_hours: float = MAX_HOURS,
    slope: float = 0.0,
) -> dict[str, np.ndarray]:
    """The harness's run on each row of d (the blocks in the order they would be measured; only
    the first ones a run needs are used): n from the pilot (0: None), the blocks used, the
    verdict code (REFUSED: stopped after the pilot) and R with its interval (NaN when refused).
    ``slope``: d carries a trend of that much per block, which is centred on each run's analysed
    blocks (the pilot's SD, and so the sizing, does not depend on where it is centred)."""
    reps, available = d.shape
    most = abstats.blocks_within(max_hours, window_s) - pilot_blocks
    n = size_runs(d[:, :pilot_blocks], margin, max(0, most))
    total = np.maximum(planned_blocks, pilot_blocks + n)
    fits = affordable_blocks(window_s, washout_s, max_hours, int(total.max()))
    refused = (n == 0) | ~fits[total]
    ran = ~refused
    if ran.any() and int(total[ran].max()) > available:
        raise ValueError(f"a run needs {int(total[ran].max())} blocks, d has {available}")
    verdict = np.full(reps, REFUSED, dtype=np.int64)
    r, low, high, low90, high90 = (np.full(reps, np.nan) for _ in range(5))
    cap = abstats.blocks_within(max_hours, window_s)
    extended = np.zeros(reps, dtype=bool)

    def judge(rows: np.ndarray, blocks: int, confidence: float) -> dict[str, np.ndarray]:
        centre = pilot_blocks + (blocks - pilot_blocks - 1) / 2
        result = analyse_fixed(d[rows, :blocks] - slope * centre, margin, pilot_blocks, confidence=confidence)
        verdict[rows] = result["verdict"]
        r[rows], low[rows], high[rows] = result["r"], result["low"], result["high"]
        low90[rows], high90[rows] = result["low90"], result["high90"]
        return result

    # one vectorised analysis per distinct total: a cell's runs end with a handful of them
    for blocks in np.unique(total[ran]):
        rows = np.flatnonzero(ran & (total == blocks))
        if blocks >= cap:  # no hours left past the planned end: one look
            judge(rows, int(blocks), abstats.CONFIDENCE)
            continue
        first = judge(rows, int(blocks), abstats.FIRST_LOOK_CONFIDENCE)
        # abstats.runs_on: inconclusive with R above 1 − margin
        extended[rows[(first["verdict"] == INCONCLUSIVE) & (first["r"] > 1 - margin)]] = True
    if extended.any():
        judge(np.flatnonzero(extended), cap, abstats.LAST_LOOK_CONFIDENCE)
    total = np.where(extended, cap, total)
    used = np.where(refused, pilot_blocks, total)
    return {
        "n": n,
        "blocks": used,
        "verdict": verdict,
        "r": r,
        "low": low,
        "high": high,
        "low90": low90,
        "high90": high90,
        "extended": extended,
    }


def summarise(
    runs: dict[str, np.ndarray],
    true_r: float,
    path: np.ndarray | None = None,
    margin: float = MARGIN,
    pilot_blocks: int = PILOT_BLOCKS,
) -> dict[str, float]:
    """A cell's figures.  ``path``: the effect moves (ln R per block), so a run's true R is its
    mean over the analysed blocks, and a certificate is false when the effect over the second
    half of them, the latest it vouches for, was at or below 1 − margin on average (a shift in the
    last block or two no test could see)."""
    verdict = runs["verdict"]
    ran = verdict != REFUSED
    certified = np.isin(verdict, (NO_SLOWDOWN, SMALLER))
    truth = np.full(verdict.shape, true_r)
    false_cert = math.nan
    if path is not None:
        blocks = runs["blocks"]
        sums = np.concatenate([np.zeros((path.shape[0], 1)), np.cumsum(path, axis=1)], axis=1)
        rows = np.arange(path.shape[0])
        span = np.maximum(blocks - pilot_blocks, 1)
        truth = np.exp((sums[rows, blocks] - sums[rows, np.minimum(pilot_blocks, blocks)]) / span)
        half = np.minimum(pilot_blocks, blocks) + span // 2
        ended = (sums[rows, blocks] - sums[rows, half]) / np.maximum(blocks - half, 1)
        false_cert = float((certified & (ended <= math.log(1 - margin) + 1e-12)).mean())
    covered = (runs["low"][ran] <= truth[ran]) & (truth[ran] <= runs["high"][ran])
    covered90 = (runs["low90"][ran] <= truth[ran]) & (truth[ran] <= runs["high90"][ran])
    return {
        "p_false": false_cert,
        "p_withheld": float((verdict == CHANGED).mean()),
        # conditional on not being refused: a refused run states no interval
        "coverage": float(covered.mean()) if ran.any() else math.nan,
        "coverage90": float(covered90.mean()) if ran.any() else math.nan,
        "completed": int(ran.sum()),
        "p_certify": float(certified.mean()),
        "p_slowdown": float((verdict == SLOWDOWN).mean()),
        "p_inconclusive": float((verdict == INCONCLUSIVE).mean()),
        "p_refused": float((~ran).mean()),
        "p_extended": float(runs["extended"].mean()),
        "mean_blocks": float(runs["blocks"].mean()),
        "max_blocks": int(runs["blocks"].max()),
    }


def simulate(
    r: float,
    sd: float,
    noise: str,
    replicates: int,
    rng: np.random.Generator,
    *,
    margin: float = MARGIN,
    pilot_blocks: int = PILOT_BLOCKS,
    planned_blocks: int = PLANNED_BLOCKS,
    window_s: float = WINDOW_S,
    washout_s: float = WASHOUT_S,
    max_hours: float = MAX_HOURS,
) -> dict[str, Any]:
    """One cell: ``replicates`` whole runs at true R ``r``, SD of d ``sd``, under ``noise``."""
    blocks = max(pilot_blocks, most_blocks(planned_blocks, window_s, washout_s, max_hours))
    d, _, slope, path = generate_d(noise, r, sd, replicates, blocks, rng, planned_blocks)
    runs = run_procedure(
        d,
        margin,
        pilot_blocks=pilot_blocks,
        planned_blocks=planned_blocks,
        window_s=window_s,
        washout_s=washout_s,
        max_hours=max_hours,
        slope=slope,
    )
    moving = path if noise in MOVING else None
    return {
        "r": r,
        "sd": sd,
        "noise": noise,
        "replicates": replicates,
        **summarise(runs, r, moving, margin, pilot_blocks),
    }


def _fmt(x: float, width: int = 8) -> str:
    return f"{'n/a':>{width}}" if math.isnan(x) else f"{x:>{width}.4f}"


def power_at(
    m: int,
    noise: str,
    robust: bool,
    replicates: int,
    rng: np.random.Generator,
    sd: float = 0.02,
    change_test: bool = True,
) -> float:
    """P(certify) at R = 1 with ``m`` analysed blocks after a pilot of 4 (which only the robust
    interval's autocorrelation estimate reads)."""
    d, _, _, _ = generate_d(noise, 1.0, sd, replicates, PILOT_BLOCKS + m, rng)
    result = analyse_fixed(d, MARGIN, PILOT_BLOCKS, robust=robust, change_test=change_test)
    return float(np.isin(result["verdict"], (NO_SLOWDOWN, SMALLER)).mean())


def blocks_for_power(
    noise: str,
    robust: bool,
    replicates: int,
    rng: np.random.Generator,
    goal: float = POWER_GOAL,
    change_test: bool = True,
) -> int | None:
    """The fewest analysed blocks whose P(certify) at R = 1, SD 0.02 reaches ``goal`` (bisection:
    the power grows with the blocks); None past the realistic cap."""
    lo, hi = 2, abstats.REALISTIC_BLOCKS
    if power_at(hi, noise, robust, replicates, rng, change_test=change_test) < goal:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if power_at(mid, noise, robust, replicates, rng, change_test=change_test) >= goal:
            hi = mid
        else:
            lo = mid + 1
    return lo


def price(replicates: int, rng: np.random.Generator) -> list[str]:
    """The analysed blocks each analysis needs for a power of 0.80 at R = 1, SD 0.02."""
    t_indep = blocks_for_power("gaussian", False, replicates, rng)
    robust_indep = blocks_for_power("gaussian", True, replicates, rng)
    robust_ar = blocks_for_power("ar1-0.5", True, replicates, rng)
    t_ar = blocks_for_power("ar1-0.5", False, replicates, rng)
    bare_indep = blocks_for_power("gaussian", True, replicates, rng, change_test=False)
    bare_ar = blocks_for_power("ar1-0.5", True, replicates, rng, change_test=False)

    def ratio(a: int | None, b: int | None) -> str:
        return "n/a" if a is None or b is None else f"{a / b:.2f}"

    return [
        f"price of robustness: analysed blocks for P(certify) ≥ {POWER_GOAL:.2f} at R = 1, SD 0.02"
        f" ({replicates} runs per point):",
        f"  independent: paired t {t_indep}, drift-robust {robust_indep}: ratio {ratio(robust_indep, t_indep)}",
        f"  AR(1) 0.5:   paired t {t_ar} (its interval is too narrow there), drift-robust {robust_ar}:"
        f" ratio {ratio(robust_ar, t_indep)} against the paired t on independent blocks,"
        f" {ratio(robust_ar, robust_indep)} against the drift-robust on independent blocks",
        f"  the change test's price (drift-robust, without it → with it): independent {bare_indep} → {robust_indep},"
        f" AR(1) 0.5 {bare_ar} → {robust_ar}",
    ]


def _moving_lines(cells: Sequence[dict[str, Any]], floor: float) -> list[str]:
    """False certification where the effect moves, and what withholding costs where it does not."""
    lines = [
        f"the effect moves, from the cell's R: false certification, a certificate while the effect over the second"
        f" half of the analysed blocks was at or below {floor:.2f} (goal ≤ {FALSE_CERT_GOAL:.2f} in every cell, every R);"
        f" P(certify) from R = {floor:.2f}:",
    ]
    for noise in MOVING:
        group = [c for c in cells if c["noise"] == noise]
        if not group:
            continue
        worst = max(group, key=lambda c: c["p_false"])
        start = ", ".join(f"SD {c['sd']:.2f} {c['p_certify']:.4f}" for c in group if math.isclose(c["r"], floor))
        lines.append(
            f"  {noise:>9}: worst cell {worst['p_false']:.4f} (R {worst['r']:.2f}, SD {worst['sd']:.2f})"
            f" {'ok' if worst['p_false'] <= FALSE_CERT_GOAL else 'ABOVE GOAL'}; from {floor:.2f}: {start}",
        )
    lines.append("withheld as 'the effect changed' where it does not move, at R = 1.00 (the change test's own rate):")
    for noise in STATIONARY:
        group = [c for c in cells if c["noise"] == noise and math.isclose(c["r"], 1.0)]
        if group:
            lines.append(f"  {noise:>9}: " + ", ".join(f"SD {c['sd']:.2f} {c['p_withheld']:.4f}" for c in group))
    return lines


def report(cells: Sequence[dict[str, Any]], margin: float, window: float = WINDOW_S) -> list[str]:
    lines = [
        f"{'R':>5} {'SD':>5} {'noise':>9} {'coverage':>8} {'cov 90%':>8} {'P(cert)':>8} {'P(false)':>8} {'P(withh)':>8}"
        f" {'P(slow)':>8} {'P(refus)':>8} {'P(ext)':>8} {'mean blk':>8} {'max blk':>7}",
    ]
    for c in cells:
        lines.append(
            f"{c['r']:>5.2f} {c['sd']:>5.2f} {c['noise']:>9} {_fmt(c['coverage'])} {_fmt(c['coverage90'])} {_fmt(c['p_certify'])}"
            f" {_fmt(c['p_false'])} {_fmt(c['p_withheld'])} {_fmt(c['p_slowdown'])} {_fmt(c['p_refused'])}"
            f" {_fmt(c['p_extended'])} {c['mean_blocks']:>8.2f} {c['max_blocks']:>7d}",
        )
    floor = round(1 - margin, 10)
    lines.append("")
    lines.append(f"false certification at R = 1 − margin = {floor:.2f} (goal ≤ {FALSE_CERT_GOAL:.2f} in every cell):")
    at_floor = [c for c in cells if math.isclose(c["r"], floor) and c["noise"] in STATIONARY]
    groups = [(noise, [c for c in at_floor if c["noise"] == noise]) for noise in STATIONARY]
    for name, group in [*groups, ("overall", at_floor)]:
        if not group:
            continue
        pooled = sum(c["p_certify"] * c["replicates"] for c in group) / sum(c["replicates"] for c in group)
        worst = max(group, key=lambda c: c["p_certify"])
        verdict = "ok" if worst["p_certify"] <= FALSE_CERT_GOAL else "ABOVE GOAL"
        lines.append(
            f"  {name:>9}: pooled {pooled:.4f}, worst cell {worst['p_certify']:.4f}"
            f" (SD {worst['sd']:.2f}{'' if name != 'overall' else ', ' + worst['noise']}) {verdict}",
        )
    lines.extend(_moving_lines(cells, floor))
    lines.append("P(certify) at R = 1.00, per SD:")
    for noise in NOISES:
        group = [c for c in cells if c["noise"] == noise and math.isclose(c["r"], 1.0)]
        if group:
            lines.append(f"  {noise:>9}: " + ", ".join(f"SD {c['sd']:.2f} {c['p_certify']:.4f}" for c in group))
    for noise in ("gaussian", "ar1-0.5"):
        power = [c for c in cells if c["noise"] == noise and math.isclose(c["r"], 1.0) and math.isclose(c["sd"], 0.02)]
        if power:
            ok = power[0]["p_certify"] >= POWER_GOAL
            lines.append(
                f"power at R = 1, SD 0.02, {noise}: {power[0]['p_certify']:.4f}"
                f" ({'at or above' if ok else 'BELOW'} {POWER_GOAL:.2f}), {power[0]['mean_blocks']:.2f} blocks"
                f" ({abstats.planned_hours(1, window) * power[0]['mean_blocks']:.1f} h) on average,"
                f" {power[0]['p_extended']:.2f} of runs went on past their first look",
            )
    covered = [c for c in cells if not math.isnan(c["coverage"])]
    if covered:
        worst = min(covered, key=lambda c: c["coverage"])
        ok = worst["coverage"] >= COVERAGE_FLOOR
        lines.append(
            f"coverage, every cell: lowest {worst['coverage']:.4f} ({worst['noise']}, R {worst['r']:.2f},"
            f" SD {worst['sd']:.2f}): {'at or above' if ok else 'BELOW'} {COVERAGE_FLOOR:.2f}",
        )
    independent = [c["coverage"] for c in covered if c["noise"] in INDEPENDENT]
    if independent:
        lowest = min(independent)
        lines.append(
            f"independent-block coverage ({', '.join(INDEPENDENT)}) of the interval the verdict used: lowest"
            f" {lowest:.4f}, {'at or above' if lowest >= COVERAGE_GOAL[0] else 'BELOW'} {COVERAGE_GOAL[0]:.2f}",
        )
    # Calibration: the 90 % interval at each run's end.  Which look a run ends at depends on its
    # data, so this reads a little under 90 % where the first look stops the luckier runs.
    independent = [c["coverage90"] for c in covered if c["noise"] in INDEPENDENT]
    if independent:
        lo, hi = min(independent), max(independent)
        inside = COVERAGE_GOAL[0] <= lo and hi <= COVERAGE_GOAL[1]
        lines.append(
            f"independent-block coverage of the 90 % interval at the run's end {lo:.4f}–{hi:.4f}:"
            f" {'within' if inside else 'NOT within'} {COVERAGE_GOAL[0]:.2f}–{COVERAGE_GOAL[1]:.2f}",
        )
    return lines


def _cell(job: tuple[Any, ...]) -> dict[str, Any]:
    """One cell from picklable arguments, for a worker process."""
    r, sd, noise, replicates, stream, margin, blocks, window, washout, max_hours = job
    return simulate(
        r,
        sd,
        noise,
        replicates,
        np.random.default_rng(stream),
        margin=margin,
        planned_blocks=blocks,
        window_s=window,
        washout_s=washout,
        max_hours=max_hours,
    )


# --- a twin's confirmation of a published certificate (arbiter.engine.abconfirm) -----------

#: twins that confirm each original certificate in a simulated fleet
TWINS = 3
#: (the original node's true R, each twin's): the fleet of true twins at 1 − margin; a true
#: original whose twins are not (the worst case for a twin); and all at 1 (the power)
SCENARIOS = (("twins", "floor", "floor"), ("unlike", 1.0, "floor"), ("power", 1.0, 1.0))


def confirm_sizes(original_d: np.ndarray, margin: float) -> np.ndarray:
    """``abconfirm.blocks_for`` for each row of an original run's blocks (all rows the same
    count): its length from all of them, at least ``abconfirm.MIN_BLOCKS``; 0 where None."""
    n = size_runs(original_d, margin)
    sized = np.minimum(abstats.REALISTIC_BLOCKS, np.maximum(abconfirm.MIN_BLOCKS, n))
    return np.where(n == 0, 0, sized)


def confirmation_cell(
    r_original: float, r_twin: float, sd: float, noise: str, replicates: int, rng: np.random.Generator, margin: float
) -> dict[str, Any]:
    """One original run per replicate (the harness's procedure), and each of :data:`TWINS`
    twins' confirmation of the certificates it earned, judged as ``abconfirm.judge`` does:
    the original's blocks only in the autocorrelation estimate, the confirmation's in R and its
    interval; adopted where its lower bound is at or above 1 − margin and it does not disagree."""
    d, _, slope, _ = generate_d(noise, r_original, sd, replicates, most_blocks(), rng)
    original = run_procedure(d, margin, slope=slope)
    passed = np.isin(original["verdict"], (NO_SLOWDOWN, SMALLER))
    used = original["blocks"]
    sizes = np.zeros(replicates, dtype=np.int64)
    for blocks in np.unique(used[passed]):
        rows = np.flatnonzero(passed & (used == blocks))
        sizes[rows] = confirm_sizes(d[rows, :blocks], margin)
    confirmed = passed & (sizes > 0)
    adopted = np.zeros((TWINS, replicates), dtype=bool)
    pairs = {(int(b), int(n)) for b, n in zip(used[confirmed], sizes[confirmed], strict=True)}
    for twin in range(TWINS):
        twin_d, _, twin_slope, _ = generate_d(noise, r_twin, sd, replicates, max(2, int(sizes.max())), rng)
        for blocks, n in sorted(pairs):
            rows = np.flatnonzero(confirmed & (used == blocks) & (sizes == n))
            # each series' trend centred where its own mean estimates R, as run_procedure does
            before = d[rows, :blocks] - slope * (PILOT_BLOCKS + (blocks - PILOT_BLOCKS - 1) / 2)
            own = twin_d[rows, :n] - twin_slope * (n - 1) / 2
            result = analyse_fixed(np.concatenate([before, own], axis=1), margin, pilot=blocks)
            agrees = (result["high"] >= original["low"][rows]) & (result["verdict"] != SLOWDOWN)
            adopted[twin, rows] = (result["low"] >= 1 - margin) & agrees
    floor = 1 - margin
    false_original = math.isclose(r_original, floor)
    certified = adopted.sum(axis=0) + (passed if false_original else 0)
    nodes = TWINS + (1 if false_original else 0)  # the nodes whose true R is 1 − margin
    return {
        "noise": noise,
        "sd": sd,
        "p_original": float(passed.mean()),
        "per_twin": float(adopted.mean()),
        "worst_twin": float(adopted.mean(axis=1).max()),
        "fleet_rate": float(certified.mean() / nodes),
        "p_any": float((certified > 0).mean()),
        "p_adopt_given": float(adopted[:, passed].mean()) if passed.any() else math.nan,
        "confirm_blocks": float(sizes[confirmed].mean()) if confirmed.any() else math.nan,
        "run_blocks": float(used[confirmed].mean()) if confirmed.any() else math.nan,
    }


def confirmation_report(replicates: int, margin: float, seed: int) -> list[str]:
    """The confirmation's error rates per noise cell, its power and its length against a run's."""
    floor = 1 - margin
    grid = [(name, sd, noise) for name, _, _ in SCENARIOS for sd in SDS for noise in STATIONARY]
    streams = np.random.SeedSequence([seed, 48]).spawn(len(grid))
    rs = {name: (floor if a == "floor" else float(a), floor if b == "floor" else float(b)) for name, a, b in SCENARIOS}
    cells = {
        (name, sd, noise): confirmation_cell(*rs[name], sd, noise, replicates, np.random.default_rng(stream), margin)
        for (name, sd, noise), stream in zip(grid, streams, strict=True)
    }
    lines = [
        "",
        f"a twin's confirmation: {replicates} fleets per cell, an original run and {TWINS} twins confirming what it "
        f"certified; false certification at R = {floor:.2f} (goal ≤ {FALSE_CERT_GOAL:.2f} per node and fleet-wide)",
        f"  twins: every node at {floor:.2f}; unlike: the original at 1, its twins at {floor:.2f} (each twin's worst "
        "case); fleet rate: the share of the nodes at that R left certified",
        f"{'noise':>9} {'SD':>5} | {'twins: orig':>11} {'twin':>7} {'fleet':>7} {'any':>7} |"
        f" {'unlike: twin':>12} {'worst':>7} {'fleet':>7} {'any':>7} | {'P(adopt)@1':>10} {'confirm':>7} {'run':>7}",
    ]
    worst_node, worst_fleet, worst_original = 0.0, 0.0, 0.0
    for sd in SDS:
        for noise in STATIONARY:
            t, u, p = (cells[(name, sd, noise)] for name, _, _ in SCENARIOS)
            worst_node = max(worst_node, t["worst_twin"], u["worst_twin"])
            worst_fleet = max(worst_fleet, t["fleet_rate"], u["fleet_rate"])
            worst_original = max(worst_original, t["p_original"])
            lines.append(
                f"{noise:>9} {sd:>5.2f} | {_fmt(t['p_original'], 11)} {_fmt(t['per_twin'], 7)}"
                f" {_fmt(t['fleet_rate'], 7)} {_fmt(t['p_any'], 7)} | {_fmt(u['per_twin'], 12)}"
                f" {_fmt(u['worst_twin'], 7)} {_fmt(u['fleet_rate'], 7)} {_fmt(u['p_any'], 7)} |"
                f" {_fmt(p['p_adopt_given'], 10)} {p['confirm_blocks']:>7.2f} {p['run_blocks']:>7.2f}"
            )
    lines.append(
        f"false certification by a confirmation, every cell: worst twin {worst_node:.4f}, worst fleet rate "
        f"{worst_fleet:.4f}: {'ok' if max(worst_node, worst_fleet) <= FALSE_CERT_GOAL else 'ABOVE GOAL'}; the "
        f"original's own (the run's procedure, judged above) at most {worst_original:.4f} here"
    )
    power = [cells[("power", sd, noise)] for sd in SDS for noise in STATIONARY]
    ran = [c for c in power if not math.isnan(c["confirm_blocks"])]
    if ran:
        confirm = sum(c["confirm_blocks"] for c in ran) / len(ran)
        run = sum(c["run_blocks"] for c in ran) / len(ran)
        lines.append(
            f"length at R = 1, mean over the cells: a confirmation {confirm:.2f} blocks against the run that earned the "
            f"certificate {run:.2f} ({confirm / run:.2f} ×); a sweep runs one such run per level it passes"
        )
    lines.append(
        "any: the chance that some node at that R is left certified; where all are twins it is the original's own "
        "false certification (no twin adopts what it did not certify);"
        f" Monte Carlo SE about {math.sqrt(0.05 * 0.95 / replicates):.4f} on a rate near 0.05"
    )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", "--replicates", dest="replicates", type=int, default=10_000, help="runs per cell")
    parser.add_argument("--workers", type=int, default=2, help="processes simulating cells (at most 2 on a shared box)")
    parser.add_argument("--seed", type=int, default=20250)
    parser.add_argument("--margin", type=float, default=MARGIN)
    parser.add_argument("--blocks", type=int, default=PLANNED_BLOCKS, help="planned blocks, as ab start --blocks")
    parser.add_argument("--window", type=float, default=WINDOW_S)
    parser.add_argument("--washout", type=float, default=WASHOUT_S)
    parser.add_argument("--max-hours", type=float, default=MAX_HOURS)
    parser.add_argument(
        "--price-replicates", type=int, default=20_000, help="runs per point of the price-of-robustness search"
    )
    parser.add_argument(
        "--confirm-replicates", type=int, default=4_000, help="fleets per cell of the twins' confirmation; 0: none"
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    # the moving cells after the steady ones, so each steady cell keeps its stream as the grid grows
    grid = [(r, sd, noise) for models in (STATIONARY, MOVING) for r in RATIOS for sd in SDS for noise in models]
    # one independent stream per cell, so a cell's figures do not depend on the grid around it
    streams = np.random.SeedSequence(args.seed).spawn(len(grid) + 1)
    jobs = [
        (r, sd, noise, args.replicates, stream, args.margin, args.blocks, args.window, args.washout, args.max_hours)
        for (r, sd, noise), stream in zip(grid, streams[:-1], strict=True)
    ]
    if args.workers > 1:
        with multiprocessing.Pool(args.workers) as pool:
            cells = pool.map(_cell, jobs)
    else:
        cells = [_cell(job) for job in jobs]
    print(
        f"{args.replicates} runs per cell, margin {args.margin}, pilot {PILOT_BLOCKS}, planned {args.blocks} blocks,"
        f" at most {args.max_hours} h ({most_blocks(args.blocks, args.window, args.washout, args.max_hours)} blocks),"
        f" seed {args.seed}",
    )
    print(
        "coverage: of the interval the verdict used (99 % at a first look, 91 % at the last, 90 % at the only one), cov 90%:"
        " of the 90 % interval at the run's end, for the true R, over runs not refused; blocks: refused runs used the pilot;"
        " the pilot sizes the run and is not in R or its interval"
    )
    print("\n".join(report(cells, args.margin, args.window)))
    if args.price_replicates > 0:
        print("\n".join(price(args.price_replicates, np.random.default_rng(streams[-1]))))
    if args.confirm_replicates > 0:
        print("\n".join(confirmation_report(args.confirm_replicates, args.margin, args.seed)))
    se = math.sqrt(0.9 * 0.1 / args.replicates)
    print(
        f"Monte Carlo SE: about {se:.4f} on a coverage near 0.90, {math.sqrt(0.05 * 0.95 / args.replicates):.4f}"
        " on a rate near 0.05"
    )
    print(f"took {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
