"""The paired run under noise in continuous time: the window length priced.

The block models of ``ab_sim`` draw each block's d directly, so they cannot say what another
window length would do.  Here the protected program's speed is a process in time, sampled every
:data:`DT` seconds, and a block is measured as the harness measures it
(:mod:`arbiter.engine.abrun`): one ON and one OFF window in random order, the first
``washout_s`` of each discarded, the rate of each the program's progress over the rest, and
d = ln(ON rate / OFF rate).  On the log scale (the fluctuations are a few per cent, so the log
of a window's mean speed is its mean log speed to well within the simulation's error):

    ln speed(t) = base(t) + [the work is ON at t] · (ln R + path(t) + e(t)) + white(t)

- ``e(t)``, the effect's stationary drift: an Ornstein-Uhlenbeck process (AR(1) per step of
  :data:`DT`), the interference of the work wandering around its mean (thermal state, the
  work's own phases);
- ``white(t)``, measurement noise: a window's mean of it has variance ``white`` / measured
  seconds (progress counted in events);
- ``path(t)``, the effect moving for good, as the block models' moving cells do, in time: a
  random walk (Brownian, its steps over one default block of 600 s S × the block SD), a level
  shift at a time drawn from blocks 8…24 of the default window, a sinusoid of period 48 default
  blocks;
- ``base(t)``, the program's own speed drifting, is left out: the ON and OFF windows of a block
  are adjacent and in random order, so its drift enters d with a random sign, uncorrelated from
  block to block, and with a variance that grows with the window (a longer window only makes it
  worse); leaving it out favours the longer windows.

Calibration (:func:`calibrate`): at the default window of 300 s (washout 60 s) the block d's
reproduce the block cell ``ar1-0.5`` at its SD: the SD of d is ``sd`` and its lag-1
autocorrelation is 0.5.  A share ``white_share`` of d's variance is white, the rest is the OU
part, whose lag-1 autocorrelation of block means is then 0.5 / (1 − white_share); the OU's time
constant is solved for that, exactly, over the four orders two neighbouring blocks can take.
Every calibration from 0 to just under 0.5 reproduces the block cell at lag 1; they differ in
how much a longer window helps: the white part shrinks with the measured seconds, the OU part's
correlation from block to block falls as the blocks lengthen, but its mean over a span of time
does not (a window averages within itself exactly what more blocks would average between them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

#: the step of the simulated speed, seconds
DT = 10.0
#: the default window and washout, as ``ab start`` takes them
BASE_WINDOW_S = 300.0
BASE_WASHOUT_S = 60.0
#: the moving paths are set in default blocks (one ON and one OFF window of 300 s)
BASE_BLOCK_S = 2 * BASE_WINDOW_S
#: the continuous models: name → the share of d's variance at the default window that is white
TIMED = {"ou": 0.0, "ou+w25": 0.25, "ou+w40": 0.40}
SHIFT = 0.02
SHIFT_BLOCKS = (8, 24)
SINE = 0.02
SINE_PERIOD_BLOCKS = 48


@dataclass(frozen=True)
class Timed:
    """A calibrated continuous model."""

    rho: float  # the OU's autocorrelation over one DT step
    sigma: float  # the OU's marginal SD
    white: float  # white noise: a window's mean has variance white / measured seconds

    @property
    def tau_s(self) -> float:
        """The OU's time constant, seconds."""
        return -DT / math.log(self.rho) if self.rho > 0 else 0.0


def _mean_cov(rho: float, length: int, gap: int) -> float:
    """Cov of the means of two runs of ``length`` steps of a unit AR(1) whose starts are ``gap``
    steps apart (gap 0: the variance of one mean)."""
    lags = np.arange(-(length - 1), length)
    weights = length - np.abs(lags)
    return float((weights * rho ** np.abs(gap + lags)).sum() / (length * length))


def ou_block_cov(rho: float, window_s: float, washout_s: float, lag: int) -> float:
    """Cov of the OU's means over the ON windows' measured parts of two blocks ``lag`` apart
    (unit OU), averaged over the blocks' random orders."""
    n, h = round(window_s / DT), round(washout_s / DT)
    length = n - h
    if lag == 0:
        return _mean_cov(rho, length, 0)
    # each block's ON window is its first or its second, by a fair coin
    gaps = [2 * n * lag + b - a for a in (0, n) for b in (0, n)]
    return sum(_mean_cov(rho, length, g) for g in gaps) / 4


def calibrate(white_share: float, sd: float, phi: float = 0.5) -> Timed:
    """The model whose blocks at the default window have SD ``sd`` and lag-1 autocorrelation
    ``phi``, a share ``white_share`` of their variance white."""
    target = phi / (1 - white_share)
    if not 0 < target < 1:
        raise ValueError(f"a white share of {white_share} cannot give a lag-1 autocorrelation of {phi}")
    lo, hi = 1e-9, 1 - 1e-12  # the block correlation grows with rho
    for _ in range(200):
        mid = (lo + hi) / 2
        corr = ou_block_cov(mid, BASE_WINDOW_S, BASE_WASHOUT_S, 1) / ou_block_cov(mid, BASE_WINDOW_S, BASE_WASHOUT_S, 0)
        lo, hi = (mid, hi) if corr < target else (lo, mid)
    rho = (lo + hi) / 2
    var_ou = (1 - white_share) * sd * sd / ou_block_cov(rho, BASE_WINDOW_S, BASE_WASHOUT_S, 0)
    measured = BASE_WINDOW_S - BASE_WASHOUT_S
    return Timed(rho, math.sqrt(var_ou), white_share * sd * sd * measured / 2)


def d_cov(model: Timed, window_s: float, washout_s: float, blocks: int) -> np.ndarray:
    """The covariance of a run's block d's, averaged over the orders."""
    lag = [model.sigma**2 * ou_block_cov(model.rho, window_s, washout_s, k) for k in range(blocks)]
    lag[0] += 2 * model.white / (window_s - washout_s)
    idx = np.arange(blocks)
    cov: np.ndarray = np.array(lag)[np.abs(idx[:, None] - idx[None, :])]
    return cov


def moving_path(kind: str, sd: float, reps: int, steps: int, rng: np.random.Generator) -> np.ndarray:
    """The effect moving for good, per DT step from the run's start (ln scale, from 0)."""
    t = np.arange(steps) * DT
    if kind == "":
        return np.zeros((1, steps))
    if kind.startswith("walk-"):
        per_step = float(kind.removeprefix("walk-")) * sd * math.sqrt(DT / BASE_BLOCK_S)
        out = np.cumsum(per_step * rng.standard_normal((reps, steps)), axis=1)
        out -= out[:, :1]
        return out
    if kind == "shift":
        at = rng.integers(SHIFT_BLOCKS[0], SHIFT_BLOCKS[1] + 1, size=reps)[:, None] * BASE_BLOCK_S
        return np.where(t[None, :] < at, SHIFT, -SHIFT)
    if kind == "sine":
        phase = rng.uniform(0, 2 * math.pi, size=reps)[:, None]
        return SINE * np.sin(2 * math.pi * t[None, :] / (SINE_PERIOD_BLOCKS * BASE_BLOCK_S) + phase)
    raise ValueError(f"unknown movement {kind!r}")


def ou_series(model: Timed, reps: int, steps: int, rng: np.random.Generator) -> np.ndarray:
    """The effect's stationary drift per DT step, started stationary."""
    out = np.empty((reps, steps))
    out[:, 0] = model.sigma * rng.standard_normal(reps)
    scale = model.sigma * math.sqrt(1 - model.rho**2)
    shocks = rng.standard_normal((reps, steps))
    for j in range(1, steps):
        out[:, j] = model.rho * out[:, j - 1] + scale * shocks[:, j]
    return out


def carve(
    effect: np.ndarray,
    truth: np.ndarray,
    white: float,
    start_s: float,
    window_s: float,
    washout_s: float,
    blocks: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Blocks measured from ``start_s`` on, as the harness does: d, the order (True: ON first) and
    the true ln R of each block (``truth``'s mean over its ON window's measured part)."""
    reps = effect.shape[0]
    n, h = round(window_s / DT), round(washout_s / DT)
    first = round(start_s / DT)
    span = effect[:, first : first + blocks * 2 * n].reshape(reps, blocks, 2, n)[..., h:].mean(axis=3)
    moved = truth[:, first : first + blocks * 2 * n].reshape(truth.shape[0], blocks, 2, n)[..., h:].mean(axis=3)
    on_first = rng.random((reps, blocks)) < 0.5
    pick = np.where(on_first, 0, 1)[..., None]
    on = np.take_along_axis(span, pick, axis=2)[..., 0]
    path = np.take_along_axis(np.broadcast_to(moved, (reps, blocks, 2)), pick, axis=2)[..., 0]
    noise = math.sqrt(2 * white / (window_s - washout_s)) * rng.standard_normal((reps, blocks))
    return on + noise, on_first, path


def oracle_end_power(
    model: Timed, window_s: float, washout_s: float, blocks: int, margin: float, alpha: float = 0.05
) -> tuple[float, float]:
    """The most any test of the run's ends can certify at R = 1: one that knows the noise model
    exactly and tests each end's mean (the first and last quarter of ``blocks``, as the procedure's
    ends) one-sided at ``alpha``, the two ends taken as independent (they are hours apart).
    Returns (the SD of an end's mean, the power for both ends)."""
    k = max(2, math.ceil(blocks * 0.25))
    cov = d_cov(model, window_s, washout_s, k)
    sd = math.sqrt(float(cov.sum()) / (k * k))
    z = NormalDist().inv_cdf(1 - alpha)
    one = NormalDist().cdf(-math.log(1 - margin) / sd - z)
    return sd, one * one
