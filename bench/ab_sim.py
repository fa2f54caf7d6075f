"""The paired ON/OFF procedure vectorised over many runs, and the noise models it is simulated
under: what bench/ab_validity.py and bench/ab_confirmation.py share.  Each function follows
the engine's own (``arbiter.engine.abstats``), row by row, which the bench's tests check."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from arbiter.engine import abstats, quantiles

RATIOS = (1.00, 0.99, 0.98, 0.97)
SDS = (0.01, 0.02, 0.05)
STATIONARY = ("gaussian", "t3", "ar1-0.3", "ar1-0.5", "ar1-0.7", "trend", "order")
#: the effect itself moves: a random walk (steps of that share of the block SD), a level shift,
#: a slow sinusoid; each starts at the cell's R
MOVING = ("walk-0.1", "walk-0.25", "walk-0.5", "shift", "sine")
NOISES = STATIONARY + MOVING
#: the random walk over each steady noise model but the trend (itself an effect that moves), for
#: the walk's own cells: ``walk-S/BASE`` (``walk-S`` is the walk over gaussian noise)
WALK_STEPS = ("0.1", "0.25", "0.5")
WALK_BASES = tuple(base for base in STATIONARY if base != "trend")
WALKS = tuple(f"walk-{step}" + ("" if base == "gaussian" else f"/{base}") for step in WALK_STEPS for base in WALK_BASES)
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
        _T_CACHE[confidence, df] = quantiles.t_quantile(1 - (1 - confidence) / 2, df)
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
    :data:`MOVING` and :data:`WALKS`).  The order is drawn for every model, as the harness always
    randomises it."""
    shape = (replicates, blocks)
    if noise.startswith("walk-"):
        step, _, base = noise.removeprefix("walk-").partition("/")
        # the base's own draws first: over gaussian noise they are the ones a walk always drew
        eps, on_first, _, _ = generate_d(base or "gaussian", 1.0, sd, replicates, blocks, rng, planned_blocks)
        steps = float(step) * sd * rng.standard_normal(shape)
        steps[:, 0] = 0.0
        path = math.log(r) + np.cumsum(steps, axis=1)
        return path + eps, on_first, 0.0, path
    on_first = rng.random(shape) < 0.5
    slope = 0.0
    path = np.full(shape, math.log(r))
    if noise in MOVING:
        eps = sd * rng.standard_normal(shape)
        if noise == "shift":
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
    sd_upper = sd * math.sqrt((n - 1) / quantiles.chi2_quantile(0.20, n - 1))
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


def end_lows(
    d: np.ndarray, confidence: float = abstats.CONFIDENCE, share: float = abstats.END_SHARE, last: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """``abstats.end_intervals`` for each row of d (every block, the pilot's included): the
    lowest of the two ends' lower bounds and the lowest of their means, on the log scale.
    ``share`` and ``last`` (False: the first end alone) for the alternatives the bench prices."""
    n = d.shape[1]
    k = max(2, math.ceil(min(n, abstats.END_GROWS_TO) * share))
    _, sd = _row_mean_sd(d)
    phi = drift_phi(d)
    whole, part = variance_factor(phi, n), variance_factor(phi, k)
    df = np.minimum(n - 1, np.maximum(1, np.floor(n / whole) - 1)).astype(np.int64)
    half = t_quantiles(df, confidence) * np.sqrt(sd * sd / k * part * (n - 1) / np.maximum(n - whole, 1.0))
    means = d[:, :k].sum(axis=1) / k
    if last:
        means = np.minimum(means, d[:, n - k :].sum(axis=1) / k)
    return means - half, means


def analyse_fixed(
    d: np.ndarray,
    margin: float,
    pilot: int = 0,
    *,
    robust: bool = True,
    change_test: bool = True,
    ends_test: bool = True,
    confidence: float = abstats.CONFIDENCE,
    end_share: float = abstats.END_SHARE,
    last_end: bool = True,
) -> dict[str, np.ndarray]:
    """``abstats.analyse`` for each row of d (all rows the same number of blocks, the first
    ``pilot`` of them left out of R): R, the 90 % interval and the verdict code.  ``robust``
    False: the paired t-interval instead, the procedure without its drift allowance;
    ``change_test`` False: without withholding a certificate when the effect changed;
    ``ends_test`` False: without judging the effect at the run's ends."""
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
    if ends_test and d.shape[1] >= 4:
        # abstats._judge_ends: an end not shown within the margin; changed where its whole 90 %
        # interval is below it (both ends' half-widths are the same, so the lowest mean's is)
        low_end, mean_end = end_lows(d, confidence, end_share, last_end)
        low90 = low_end if confidence == abstats.CONFIDENCE else end_lows(d, share=end_share, last=last_end)[0]
        short = np.isin(verdict, (NO_SLOWDOWN, SMALLER)) & (low_end < math.log(floor))
        verdict[short] = np.where(2 * mean_end[short] - low90[short] < math.log(floor), CHANGED, INCONCLUSIVE)
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
    end_share: float = abstats.END_SHARE,
    last_end: bool = True,
) -> dict[str, np.ndarray]:
    """The harness's run on each row of d (the blocks in the order they would be measured; only
    the first ones a run needs are used): n from the pilot (0: None), the blocks used, the
    verdict code (REFUSED: stopped after the pilot) and R with its interval (NaN when refused).
    ``slope``: d carries a trend of that much per block, which is centred on each run's analysed
    blocks (the pilot's SD, and so the sizing, does not depend on where it is centred).
    ``end_share``, ``last_end``: the ends judged otherwise, for the alternatives the bench prices."""
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
        result = analyse_fixed(
            d[rows, :blocks] - slope * centre,
            margin,
            pilot_blocks,
            confidence=confidence,
            end_share=end_share,
            last_end=last_end,
        )
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


def fmt(x: float, width: int = 8) -> str:
    return f"{'n/a':>{width}}" if math.isnan(x) else f"{x:>{width}.4f}"
