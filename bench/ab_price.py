"""What the paired run's safeguards cost: the analysed blocks each analysis needs for a power of
0.80 at R = 1, SD 0.02 (the paired t-interval, the drift-robust one, with the change test and with
the run's ends judged too), and the ends judged in other ways beside the procedure's.  Printed by
``bench/ab_validity.py``; these are its parts that price, apart from those that judge.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_sim import (
    MARGIN,
    NO_SLOWDOWN,
    PILOT_BLOCKS,
    POWER_GOAL,
    SDS,
    SMALLER,
    STATIONARY,
    WALKS,
    analyse_fixed,
    generate_d,
    most_blocks,
    run_procedure,
)

from arbiter.engine import abstats


def power_at(
    m: int,
    noise: str,
    robust: bool,
    replicates: int,
    rng: np.random.Generator,
    sd: float = 0.02,
    change_test: bool = True,
    ends_test: bool = True,
) -> float:
    """P(certify) at R = 1 with ``m`` analysed blocks after a pilot of 4 (which only the robust
    interval's autocorrelation estimate and the first end read)."""
    d, _, _, _ = generate_d(noise, 1.0, sd, replicates, PILOT_BLOCKS + m, rng)
    result = analyse_fixed(d, MARGIN, PILOT_BLOCKS, robust=robust, change_test=change_test, ends_test=ends_test)
    return float(np.isin(result["verdict"], (NO_SLOWDOWN, SMALLER)).mean())


def blocks_for_power(
    noise: str,
    robust: bool,
    replicates: int,
    rng: np.random.Generator,
    goal: float = POWER_GOAL,
    change_test: bool = True,
    ends_test: bool = True,
) -> int | None:
    """The fewest analysed blocks whose P(certify) at R = 1, SD 0.02 reaches ``goal`` (bisection:
    the power grows with the blocks); None past the realistic cap."""
    lo, hi = 2, abstats.REALISTIC_BLOCKS
    if power_at(hi, noise, robust, replicates, rng, change_test=change_test, ends_test=ends_test) < goal:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if power_at(mid, noise, robust, replicates, rng, change_test=change_test, ends_test=ends_test) >= goal:
            hi = mid
        else:
            lo = mid + 1
    return lo


def price(replicates: int, rng: np.random.Generator) -> list[str]:
    """The analysed blocks each analysis needs for a power of 0.80 at R = 1, SD 0.02: the
    intervals alone, then with the change test, then with the ends judged too (the procedure)."""

    def need(noise: str, robust: bool, change: bool = False, ends: bool = False) -> int | None:
        return blocks_for_power(noise, robust, replicates, rng, change_test=change, ends_test=ends)

    t_indep, robust_indep = need("gaussian", False), need("gaussian", True)
    t_ar, robust_ar = need("ar1-0.5", False), need("ar1-0.5", True)
    change_indep, change_ar = need("gaussian", True, True), need("ar1-0.5", True, True)
    ends_indep, ends_ar = need("gaussian", True, True, True), need("ar1-0.5", True, True, True)
    cap = most_blocks() - PILOT_BLOCKS

    def ratio(a: int | None, b: int | None) -> str:
        return "n/a" if a is None or b is None else f"{a / b:.2f}"

    def blocks(m: int | None) -> str:
        return f"more than {abstats.REALISTIC_BLOCKS}" if m is None else str(m)

    return [
        f"price of robustness: analysed blocks for P(certify) ≥ {POWER_GOAL:.2f} at R = 1, SD 0.02, one look at"
        f" 90 % ({replicates} runs per point; a run's hours leave {cap} after the pilot):",
        f"  independent: paired t {t_indep}, drift-robust {robust_indep}: ratio {ratio(robust_indep, t_indep)}",
        f"  AR(1) 0.5:   paired t {t_ar} (its interval is too narrow there), drift-robust {robust_ar}:"
        f" ratio {ratio(robust_ar, t_indep)} against the paired t on independent blocks,"
        f" {ratio(robust_ar, robust_indep)} against the drift-robust on independent blocks",
        f"  the change test's price (drift-robust, without it → with it): independent {robust_indep} → {change_indep},"
        f" AR(1) 0.5 {robust_ar} → {change_ar}",
        f"  the ends' price (a certificate vouches for the effect at the run's start and end too; the change test's"
        f" blocks → the procedure's): independent {change_indep} → {blocks(ends_indep)},"
        f" AR(1) 0.5 {change_ar} → {blocks(ends_ar)}",
    ]


#: the ends judged otherwise, priced beside the procedure's (a share of every block at each end, and
#: whether the last end is judged too)
ALTERNATIVES = ((0.5, True), (1 / 3, True), (0.25, True), (0.25, False), (0.15, False))


def _certify(
    noise: str,
    r: float,
    sd: float,
    replicates: int,
    blocks: int,
    margin: float,
    share: float,
    last: bool,
    rng: np.random.Generator,
) -> float:
    """P(certify) of whole runs with the ends judged over ``share`` (``last``: both ends)."""
    d, _, slope, _ = generate_d(noise, r, sd, replicates, blocks, rng)
    runs = run_procedure(d, margin, slope=slope, end_share=share, last_end=last)
    return float(np.isin(runs["verdict"], (NO_SLOWDOWN, SMALLER)).mean())


def alternatives(replicates: int, seed: int, margin: float = MARGIN) -> list[str]:
    """Each way of judging the ends: the worst false certification of the walk from 1 − margin
    (every step, steady model and SD), of steady runs at 1 − margin, and P(certify) at R = 1,
    SD 0.02, gaussian and AR(1) 0.5; the same random blocks for each."""
    blocks = most_blocks()
    floor = round(1 - margin, 10)
    lines = [
        f"the ends judged otherwise ({replicates} runs per cell; the procedure's: a quarter, both ends):",
        f"  {'share':>5} {'ends':>10} | {'walk worst':>10} {'steady worst':>12} | {'P(cert) gaussian':>16} {'AR(1) 0.5':>9}",
    ]
    for share, last in ALTERNATIVES:
        rng = np.random.default_rng(seed)
        cell = (replicates, blocks, margin, share, last, rng)
        walk = max(_certify(noise, floor, sd, *cell) for noise in WALKS for sd in SDS)
        steady = max(_certify(noise, floor, sd, *cell) for noise in STATIONARY for sd in SDS)
        power = [_certify(noise, 1.0, 0.02, *cell) for noise in ("gaussian", "ar1-0.5")]
        lines.append(
            f"  {share:>5.2f} {'both' if last else 'first only':>10} | {walk:>10.4f} {steady:>12.4f} |"
            f" {power[0]:>16.4f} {power[1]:>9.4f}"
        )
    return lines
