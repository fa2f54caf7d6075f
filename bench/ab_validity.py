"""Does the paired ON/OFF procedure (SPEC section 8) keep its promises?  A simulation of the
whole run as the harness does it: pilot, sizing, refusal, the remaining blocks, the verdict.

    uv run python bench/ab_validity.py [--replicates 10000] [--seed 20250] [--margin 0.02]

1. A pilot of 4 blocks, each giving d_i = ln(ON_i / OFF_i).
2. n = what ``abstats.blocks_needed`` says for the pilot; the run totals max(--blocks, n) blocks.
   A run whose n is None, or whose planned hours exceed --max-hours, is refused after the pilot
   (it never certifies; its 4 pilot blocks are what it used).
3. The remaining blocks are run and every block, pilot included, is analysed as
   ``abstats.analyse`` does: the paired t-interval at 90 % for R = exp(mean d) and its verdict.

Grid: true R in {1.00, 0.99, 0.98, 0.97} × SD of d in {0.01, 0.02, 0.05} × four noise models:
``gaussian``; ``t3`` (Student t, 3 degrees of freedom, scaled to the SD: heavy tails);
``ar1`` (d autocorrelated with phi = 0.5, marginal SD the given one: drift across blocks);
``order`` (gaussian, plus ±SD/2 depending on whether the block ran ON or OFF first, by a fair coin).

Per cell: coverage of the 90 % interval for the true R over the runs that were not refused
(goal 0.88–0.92), P(certify), P(slowdown), P(refused) and the blocks used.  Then the false
certification rate at R = 1 − margin (goal ≤ 0.05), P(certify) at R = 1 and whether the
gaussian coverage is inside its goal.

Everything is vectorised over replicates; the only Python loops run over blocks (to build the
AR(1) series) and over the few distinct block counts a cell's runs end with.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

from arbiter.engine import abstats

RATIOS = (1.00, 0.99, 0.98, 0.97)
SDS = (0.01, 0.02, 0.05)
NOISES = ("gaussian", "t3", "ar1", "order")
MARGIN = 0.02
PILOT_BLOCKS = 4
PLANNED_BLOCKS = 12
WINDOW_S = 300.0
WASHOUT_S = 60.0
MAX_HOURS = 8.0
PHI = 0.5
COVERAGE_GOAL = (0.88, 0.92)
FALSE_CERT_GOAL = 0.05

# verdict codes, indexing abstats's verdict names; REFUSED: stopped after the pilot
VERDICTS: tuple[abstats.Verdict, ...] = (
    "no slowdown shown",
    "slowdown smaller than the margin",
    "slowdown",
    "inconclusive",
)
NO_SLOWDOWN, SMALLER, SLOWDOWN, INCONCLUSIVE = range(4)
REFUSED = -1

_TWO_SIDED = 1 - (1 - abstats.CONFIDENCE) / 2
# the t quantile's limit as df grows: no t quantile is below it, which bounds the sizing from below
_Z = NormalDist().inv_cdf(_TWO_SIDED)
_T_CACHE: dict[int, float] = {}


def t_quantile(df: int) -> float:
    """abstats's own two-sided t quantile, so the numbers match it exactly; cached because its
    quadrature costs milliseconds and a cell asks for the same few df thousands of times."""
    if df not in _T_CACHE:
        _T_CACHE[df] = abstats.t_quantile(_TWO_SIDED, df)
    return _T_CACHE[df]


def t_quantiles(df: np.ndarray) -> np.ndarray:
    uniq, inverse = np.unique(df, return_inverse=True)
    return np.array([t_quantile(int(k)) for k in uniq])[inverse].reshape(df.shape)


def generate_d(
    noise: str,
    r: float,
    sd: float,
    replicates: int,
    blocks: int,
    rng: np.random.Generator,
    phi: float = PHI,
) -> tuple[np.ndarray, np.ndarray]:
    """d (replicates × blocks) around ln r with SD ``sd`` under ``noise``, and each block's order
    (True: ON first).  The order is drawn for every model, as the harness always randomises it."""
    shape = (replicates, blocks)
    on_first = rng.random(shape) < 0.5
    if noise == "gaussian":
        eps = sd * rng.standard_normal(shape)
    elif noise == "t3":
        eps = sd / math.sqrt(3.0) * rng.standard_t(3, shape)  # t with 3 df has variance 3
    elif noise == "ar1":
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
    return math.log(r) + eps, on_first


def _row_mean_sd(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # the same two-pass formula as abstats._sd, so the last bits agree as closely as they can
    n = d.shape[1]
    mean = d.sum(axis=1) / n
    sd = np.sqrt(((d - mean[:, None]) ** 2).sum(axis=1) / (n - 1))
    return mean, sd


def size_runs(pilot_d: np.ndarray, margin: float) -> np.ndarray:
    """``abstats.blocks_needed`` for each row of pilot d's; 0 where it would say None."""
    reps, n = pilot_d.shape
    if n < 2:
        raise ValueError("a pilot needs at least 2 blocks")
    _, sd = _row_mean_sd(pilot_d)
    sd_upper = sd * math.sqrt((n - 1) / abstats.chi2_quantile(0.20, n - 1))
    gap = -math.log(1 - margin)
    cap = abstats.REALISTIC_BLOCKS
    # Every iterate after the first is at least (z·sd_upper/gap)²: above the cap, the answer is None
    # whatever t does, so those rows skip the iteration and never ask for quantiles at huge df.
    # The +1 leaves room for the quadrature's last digits.
    hopeless = (_Z * sd_upper / gap) ** 2 > cap + 1
    needed = np.full(reps, n, dtype=np.int64)
    active = ~hopeless
    for _ in range(20):  # as many rounds as abstats allows, so an unsettled row ends where it does
        rows = np.flatnonzero(active)
        if rows.size == 0:
            break
        t = t_quantiles(np.maximum(1, needed[rows] - 1))
        new = np.maximum(n, np.ceil((t * sd_upper[rows] / gap) ** 2)).astype(np.int64)
        settled = new == needed[rows]
        needed[rows] = new
        active[rows[settled]] = False
    return np.where(hopeless | (needed > cap), 0, needed)


def analyse_fixed(d: np.ndarray, margin: float) -> dict[str, np.ndarray]:
    """``abstats.analyse`` for each row of d (all rows the same number of blocks): R, the 90 %
    interval and the verdict code."""
    n = d.shape[1]
    if n < 2:
        raise ValueError("a paired t-interval needs at least 2 blocks")
    mean, sd = _row_mean_sd(d)
    half = t_quantile(n - 1) * sd / math.sqrt(n)
    r, low, high = np.exp(mean), np.exp(mean - half), np.exp(mean + half)
    floor = 1 - margin
    verdict = np.full(d.shape[0], INCONCLUSIVE, dtype=np.int64)
    verdict[(high < 1) & (r < floor)] = SLOWDOWN
    certifies = low >= floor  # abstats tests this first, so it overrides a slowdown
    verdict[certifies] = np.where(high[certifies] < 1, SMALLER, NO_SLOWDOWN)
    return {"r": r, "low": low, "high": high, "verdict": verdict}


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
) -> dict[str, np.ndarray]:
    """The harness's run on each row of d (the blocks in the order they would be measured; only
    the first ones a run needs are used): n from the pilot (0: None), the blocks used, the
    verdict code (REFUSED: stopped after the pilot) and R with its interval (NaN when refused)."""
    reps, available = d.shape
    n = size_runs(d[:, :pilot_blocks], margin)
    total = np.maximum(planned_blocks, n)
    fits = affordable_blocks(window_s, washout_s, max_hours, int(total.max()))
    refused = (n == 0) | ~fits[total]
    ran = ~refused
    if ran.any() and int(total[ran].max()) > available:
        raise ValueError(f"a run needs {int(total[ran].max())} blocks, d has {available}")
    verdict = np.full(reps, REFUSED, dtype=np.int64)
    r, low, high = (np.full(reps, np.nan) for _ in range(3))
    # one vectorised analysis per distinct total: a cell's runs end with a handful of them
    for blocks in np.unique(total[ran]):
        rows = np.flatnonzero(ran & (total == blocks))
        result = analyse_fixed(d[rows, :blocks], margin)
        verdict[rows] = result["verdict"]
        r[rows], low[rows], high[rows] = result["r"], result["low"], result["high"]
    used = np.where(refused, pilot_blocks, total)
    return {"n": n, "blocks": used, "verdict": verdict, "r": r, "low": low, "high": high}


def summarise(runs: dict[str, np.ndarray], true_r: float) -> dict[str, float]:
    verdict = runs["verdict"]
    ran = verdict != REFUSED
    covered = (runs["low"][ran] <= true_r) & (true_r <= runs["high"][ran])
    return {
        # conditional on not being refused: a refused run states no interval
        "coverage": float(covered.mean()) if ran.any() else math.nan,
        "completed": int(ran.sum()),
        "p_certify": float(np.isin(verdict, (NO_SLOWDOWN, SMALLER)).mean()),
        "p_slowdown": float((verdict == SLOWDOWN).mean()),
        "p_inconclusive": float((verdict == INCONCLUSIVE).mean()),
        "p_refused": float((~ran).mean()),
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
    phi: float = PHI,
) -> dict[str, Any]:
    """One cell: ``replicates`` whole runs at true R ``r``, SD of d ``sd``, under ``noise``."""
    blocks = max(pilot_blocks, most_blocks(planned_blocks, window_s, washout_s, max_hours))
    d, _ = generate_d(noise, r, sd, replicates, blocks, rng, phi)
    runs = run_procedure(
        d,
        margin,
        pilot_blocks=pilot_blocks,
        planned_blocks=planned_blocks,
        window_s=window_s,
        washout_s=washout_s,
        max_hours=max_hours,
    )
    return {"r": r, "sd": sd, "noise": noise, "replicates": replicates, **summarise(runs, r)}


def _fmt(x: float, width: int = 8) -> str:
    return f"{'n/a':>{width}}" if math.isnan(x) else f"{x:>{width}.4f}"


def report(cells: Sequence[dict[str, Any]], margin: float) -> list[str]:
    lines = [
        f"{'R':>5} {'SD':>5} {'noise':>9} {'coverage':>8} {'P(cert)':>8} {'P(slow)':>8} {'P(refus)':>8}"
        f" {'mean blk':>8} {'max blk':>7}",
    ]
    for c in cells:
        lines.append(
            f"{c['r']:>5.2f} {c['sd']:>5.2f} {c['noise']:>9} {_fmt(c['coverage'])} {_fmt(c['p_certify'])}"
            f" {_fmt(c['p_slowdown'])} {_fmt(c['p_refused'])} {c['mean_blocks']:>8.2f} {c['max_blocks']:>7d}",
        )
    floor = round(1 - margin, 10)
    lines.append("")
    lines.append(f"false certification at R = 1 − margin = {floor:.2f} (goal ≤ {FALSE_CERT_GOAL:.2f}):")
    at_floor = [c for c in cells if math.isclose(c["r"], floor)]
    groups = [(noise, [c for c in at_floor if c["noise"] == noise]) for noise in NOISES]
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
    lines.append("P(certify) at R = 1.00, per SD:")
    for noise in NOISES:
        group = [c for c in cells if c["noise"] == noise and math.isclose(c["r"], 1.0)]
        if group:
            lines.append(f"  {noise:>9}: " + ", ".join(f"SD {c['sd']:.2f} {c['p_certify']:.4f}" for c in group))
    gaussian = [c["coverage"] for c in cells if c["noise"] == "gaussian" and not math.isnan(c["coverage"])]
    if gaussian:
        lo, hi = min(gaussian), max(gaussian)
        inside = COVERAGE_GOAL[0] <= lo and hi <= COVERAGE_GOAL[1]
        lines.append(
            f"gaussian coverage {lo:.4f}–{hi:.4f} across its cells:"
            f" {'within' if inside else 'NOT within'} {COVERAGE_GOAL[0]:.2f}–{COVERAGE_GOAL[1]:.2f}",
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=10_000, help="runs per cell")
    parser.add_argument("--seed", type=int, default=20250)
    parser.add_argument("--margin", type=float, default=MARGIN)
    parser.add_argument("--blocks", type=int, default=PLANNED_BLOCKS, help="planned blocks, as ab start --blocks")
    parser.add_argument("--window", type=float, default=WINDOW_S)
    parser.add_argument("--washout", type=float, default=WASHOUT_S)
    parser.add_argument("--max-hours", type=float, default=MAX_HOURS)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    grid = [(r, sd, noise) for r in RATIOS for sd in SDS for noise in NOISES]
    # one independent stream per cell, so a cell's figures do not depend on the grid around it
    streams = np.random.SeedSequence(args.seed).spawn(len(grid))
    cells = [
        simulate(
            r,
            sd,
            noise,
            args.replicates,
            np.random.default_rng(stream),
            margin=args.margin,
            planned_blocks=args.blocks,
            window_s=args.window,
            washout_s=args.washout,
            max_hours=args.max_hours,
        )
        for (r, sd, noise), stream in zip(grid, streams, strict=True)
    ]
    print(
        f"{args.replicates} runs per cell, margin {args.margin}, pilot {PILOT_BLOCKS}, planned {args.blocks} blocks,"
        f" at most {args.max_hours} h ({most_blocks(args.blocks, args.window, args.washout, args.max_hours)} blocks),"
        f" seed {args.seed}",
    )
    print("coverage: of the 90 % interval for the true R, over runs not refused; blocks: refused runs used the pilot")
    print("\n".join(report(cells, args.margin)))
    se = math.sqrt(0.9 * 0.1 / args.replicates)
    print(
        f"Monte Carlo SE: about {se:.4f} on a coverage near 0.90, {math.sqrt(0.05 * 0.95 / args.replicates):.4f}"
        " on a rate near 0.05"
    )
    print(f"took {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
