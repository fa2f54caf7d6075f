"""The window length priced on the continuous-time noise of ``ab_time``: fixed windows of 1, 2
and 4 × the default, and a window the pilot chooses, each through the whole procedure, with the
validity cells beside the power; and the bound no window escapes.  Printed by
``bench/ab_validity.py --windows RUNS``.

The pilot's choice (:func:`choose`): the pilot's 4 blocks at the default window, the
autocorrelation the engine's interval would assume from them (``abstats.drift_phi``: the lag-1
estimate, bias-corrected, plus its allowance), and the shortest multiple k of the default window
in :data:`MULTIPLES` with that autocorrelation^k at most :data:`NEARLY_INDEPENDENT` (an OU drift's
correlation from block to block falls as φ^k when the blocks are k times as long), among those
that leave at least :data:`MIN_BLOCKS` blocks within the hours.  A run that keeps the default
window is the procedure as it is (two looks); one that lengthens it runs its hours' remaining
blocks at the new window and judges them alone (the pilot's blocks, of another length, only chose
the window), at one look at 90 %, its ends the first and last quarter of those blocks.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from statistics import NormalDist

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_sim import (
    CHANGED,
    FALSE_CERT_GOAL,
    MARGIN,
    NO_SLOWDOWN,
    PILOT_BLOCKS,
    POWER_GOAL,
    REFUSED,
    SMALLER,
    analyse_fixed,
    drift_phi,
    generate_d,
    most_blocks,
    run_procedure,
)
from ab_time import BASE_WASHOUT_S, BASE_WINDOW_S, DT, TIMED, calibrate, carve, moving_path, oracle_end_power, ou_series

from arbiter.engine import abstats

MAX_HOURS = 8.0
MULTIPLES = (1, 2, 4)
NEARLY_INDEPENDENT = 0.25
MIN_BLOCKS = 8
MOVEMENTS = ("", "walk-0.1", "walk-0.25", "walk-0.5", "shift", "sine")
RULES = ("300 s", "600 s", "1200 s", "pilot")


def choose(pilot_d: np.ndarray, max_hours: float = MAX_HOURS) -> np.ndarray:
    """The window multiple each run's pilot chooses."""
    phi = np.maximum(drift_phi(pilot_d), 0.0)
    left = max_hours * 3600 - pilot_d.shape[1] * 2 * BASE_WINDOW_S
    fitting = [k for k in MULTIPLES if k == 1 or math.floor(left / (2 * k * BASE_WINDOW_S)) >= MIN_BLOCKS]
    chosen = np.full(pilot_d.shape[0], fitting[-1])
    for k in reversed(fitting):
        chosen = np.where(phi**k <= NEARLY_INDEPENDENT, k, chosen)
    return chosen


def _fixed(
    effect: np.ndarray, truth: np.ndarray, white: float, window: float, rng: np.random.Generator
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """The procedure as it is at one window: its runs, the blocks' true ln R, the hours used."""
    blocks = abstats.blocks_within(MAX_HOURS, window)
    d, _, path = carve(effect, truth, white, 0.0, window, BASE_WASHOUT_S, blocks, rng)
    runs = run_procedure(d, MARGIN, window_s=window, washout_s=BASE_WASHOUT_S, max_hours=MAX_HOURS)
    return runs, path, runs["blocks"] * 2 * window / 3600


def _piloted(
    effect: np.ndarray, truth: np.ndarray, white: float, rng: np.random.Generator
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
    """The pilot chooses the window (:func:`choose`); also returns each run's multiple."""
    base, _, path0 = carve(
        effect, truth, white, 0.0, BASE_WINDOW_S, BASE_WASHOUT_S, abstats.blocks_within(MAX_HOURS, BASE_WINDOW_S), rng
    )
    k = choose(base[:, :PILOT_BLOCKS])
    runs = run_procedure(base, MARGIN, window_s=BASE_WINDOW_S, washout_s=BASE_WASHOUT_S, max_hours=MAX_HOURS)
    hours = runs["blocks"] * 2 * BASE_WINDOW_S / 3600
    path = path0.copy()
    start = PILOT_BLOCKS * 2 * BASE_WINDOW_S
    for mult in MULTIPLES[1:]:
        rows = np.flatnonzero(k == mult)
        if rows.size == 0:
            continue
        window = mult * BASE_WINDOW_S
        blocks = math.floor((MAX_HOURS * 3600 - start) / (2 * window))
        truth_rows = truth if truth.shape[0] == 1 else truth[rows]
        d, _, p = carve(effect[rows], truth_rows, white, start, window, BASE_WASHOUT_S, blocks, rng)
        result = analyse_fixed(d, MARGIN, 0)
        runs["verdict"][rows] = result["verdict"]
        for key in ("r", "low", "high", "low90", "high90"):
            runs[key][rows] = result[key]
        runs["extended"][rows] = False
        runs["blocks"][rows] = PILOT_BLOCKS + blocks
        hours[rows] = (start + blocks * 2 * window) / 3600
        path[rows, PILOT_BLOCKS : PILOT_BLOCKS + blocks] = p
        path[rows, PILOT_BLOCKS + blocks :] = 0.0
    return runs, path, hours, k


def _figures(runs: dict[str, np.ndarray], path: np.ndarray, hours: np.ndarray, floor: float) -> dict[str, float]:
    """P(certify); where the effect moves, the second-half false certification (as the block
    cells judge it); coverage of the true mean effect over the analysed blocks; hours used."""
    verdict = runs["verdict"]
    certified = np.isin(verdict, (NO_SLOWDOWN, SMALLER))
    ran = verdict != REFUSED
    blocks = runs["blocks"]
    rows = np.arange(path.shape[0])
    sums = np.concatenate([np.zeros((path.shape[0], 1)), np.cumsum(path, axis=1)], axis=1)
    span = np.maximum(blocks - PILOT_BLOCKS, 1)
    truth = np.exp((sums[rows, blocks] - sums[rows, PILOT_BLOCKS]) / span)
    half = PILOT_BLOCKS + span // 2
    ended = (sums[rows, blocks] - sums[rows, half]) / np.maximum(blocks - half, 1)
    covered = (runs["low"][ran] <= truth[ran]) & (truth[ran] <= runs["high"][ran])
    return {
        "certify": float(certified.mean()),
        "f2nd": float((certified & (ended <= math.log(floor) + 1e-12)).mean()),
        "withheld": float((verdict == CHANGED).mean()),
        "coverage": float(covered.mean()) if ran.any() else math.nan,
        "hours": float(hours.mean()),
    }


def cell(
    model: str, movement: str, r: float, replicates: int, rng: np.random.Generator, sd: float = 0.02
) -> dict[str, dict[str, float]]:
    """One noise model, movement and R, through every rule on the same simulated speeds."""
    timed = calibrate(TIMED[model], sd)
    steps = round(MAX_HOURS * 3600 / DT)
    out: dict[str, list[dict[str, float]]] = {rule: [] for rule in RULES}
    chosen: list[np.ndarray] = []
    for lo in range(0, replicates, 2500):  # in slices: a run's speeds are 2880 steps
        reps = min(2500, replicates - lo)
        truth = math.log(r) + moving_path(movement, sd, reps, steps, rng)
        effect = truth + ou_series(timed, reps, steps, rng)
        for mult, rule in zip(MULTIPLES, RULES, strict=False):
            runs, path, hours = _fixed(effect, truth, timed.white, mult * BASE_WINDOW_S, rng)
            out[rule].append({**_figures(runs, path, hours, 1 - MARGIN), "n": reps})
        runs, path, hours, k = _piloted(effect, truth, timed.white, rng)
        out["pilot"].append({**_figures(runs, path, hours, 1 - MARGIN), "n": reps})
        chosen.append(k)
    merged = {rule: _pool(parts) for rule, parts in out.items()}
    ks = np.concatenate(chosen)
    merged["pilot"].update({f"k{m}": float((ks == m).mean()) for m in MULTIPLES})
    return merged


def _pool(parts: list[dict[str, float]]) -> dict[str, float]:
    total = sum(p["n"] for p in parts)
    keys = [k for k in parts[0] if k != "n"]
    return {k: sum(p[k] * p["n"] for p in parts if not math.isnan(p[k])) / total for k in keys}


def window_report(replicates: int, seed: int, progress: Callable[[str], None] | None = None) -> list[str]:
    """Every rule in every continuous cell at SD 0.02, and the bound."""
    rng = np.random.default_rng(seed)
    floor = round(1 - MARGIN, 10)
    lines = [
        f"the window length, on noise in continuous time ({replicates} runs per cell, SD 0.02, {MAX_HOURS:g} h):"
        " models calibrated so that 300 s windows give d an SD of 0.02 and a lag-1 autocorrelation of 0.5",
    ]
    for model, share in TIMED.items():
        timed = calibrate(share, 0.02)
        lines.append(
            f"  {model}: white share {share:.2f} of d's variance at 300 s, the effect's OU time constant"
            f" {timed.tau_s:.0f} s, its SD {timed.sigma:.4f}"
        )
    head = f"  {'model':>7} {'cell':>14} | " + " | ".join(f"{rule:>23}" for rule in RULES)
    lines += ["  per rule: P(certify) [P(f,2nd) where the effect moves] (coverage) hours", head]
    worst = dict.fromkeys(RULES, 0.0)
    lowest = dict.fromkeys(RULES, 1.0)
    for model in TIMED:
        for movement in MOVEMENTS:
            for r in (1.0, floor) if movement in ("", "shift", "sine") else (floor,):
                got = cell(model, movement, r, replicates, rng)
                if progress:
                    progress(f"{model} {movement or 'steady'} {r}")
                parts = []
                for rule in RULES:
                    g = got[rule]
                    moving = movement in ("shift", "sine")
                    false = g["f2nd"] if moving else (g["certify"] if math.isclose(r, floor) else 0.0)
                    worst[rule] = max(worst[rule], false)
                    if movement == "":
                        lowest[rule] = min(lowest[rule], g["coverage"])
                    extra = f"[{g['f2nd']:.3f}]" if moving else "       "
                    parts.append(f"{g['certify']:.3f} {extra} ({g['coverage']:.3f}) {g['hours']:.1f}")
                name = f"{movement or 'steady'} {r:.2f}"
                lines.append(f"  {model:>7} {name:>14} | " + " | ".join(f"{p:>23}" for p in parts))
                if movement == "" and math.isclose(r, 1.0):
                    pilot = got["pilot"]
                    lines.append(
                        f"  {'':>7} {'':>14}   the pilot chose 300/600/1200 s in {pilot['k1']:.2f}/{pilot['k2']:.2f}/"
                        f"{pilot['k4']:.2f} of runs"
                    )
    for rule in RULES:
        verdict = "ok" if worst[rule] <= FALSE_CERT_GOAL else "ABOVE GOAL"
        lines.append(
            f"  {rule:>7}: worst false certification {worst[rule]:.4f} {verdict}; lowest coverage (steady) {lowest[rule]:.3f}"
        )
    lines += bound_lines()
    return lines


def bound_lines(margin: float = MARGIN) -> list[str]:
    """What no window escapes: the ends' means over a quarter of the run's hours."""
    lines = [
        f"the bound: P(certify) at R = 1 of a test that knows the noise model and tests each end's mean (a quarter of"
        f" the blocks) one-sided at 5 %, goal {POWER_GOAL:.2f}; SD of an end's mean in brackets:",
    ]
    # the block cell itself: d AR(1) with φ 0.5 from block to block, 48 blocks, a quarter of 12
    k = math.ceil(abstats.blocks_within(MAX_HOURS, BASE_WINDOW_S) * 0.25)
    lags = np.abs(np.arange(k)[:, None] - np.arange(k)[None, :])
    sd = 0.02 * math.sqrt(float((0.5**lags).sum())) / k
    one = NormalDist().cdf(-math.log(1 - margin) / sd - NormalDist().inv_cdf(0.95))
    lines.append(f"  the block cell ar1-0.5 at 300 s: {one * one:.3f} ({sd:.4f})")
    for model, share in TIMED.items():
        timed = calibrate(share, 0.02)
        parts = []
        for window in (300.0, 600.0, 900.0, 1200.0, 2400.0):
            sd, power = oracle_end_power(
                timed, window, BASE_WASHOUT_S, abstats.blocks_within(MAX_HOURS, window), margin
            )
            parts.append(f"{window:.0f} s {power:.3f} ({sd:.4f})")
        hours = next(
            (
                h
                for h in range(8, 73)
                if oracle_end_power(
                    timed, BASE_WINDOW_S, BASE_WASHOUT_S, abstats.blocks_within(h, BASE_WINDOW_S), margin
                )[1]
                >= POWER_GOAL
            ),
            None,
        )
        lines.append(
            f"  {model:>7} within {MAX_HOURS:g} h: "
            + ", ".join(parts)
            + f"; {POWER_GOAL:.2f} first reached at 300 s with"
            f" --max-hours {hours if hours is not None else 'over 72'}"
        )
    return lines


#: the steady and moving block cells at 1 − margin that a longer cap is judged on (SD 0.02)
HOURS_FALSE = ("gaussian", "ar1-0.5", "ar1-0.7", "walk-0.1", "walk-0.25", "walk-0.5", "walk-0.25/ar1-0.5")


def hours_report(replicates: int, seed: int, hours: tuple[float, ...] = (8.0, 12.0, 16.0, 24.0)) -> list[str]:
    """What a longer --max-hours buys under the block cell AR(1) 0.5, SD 0.02, at the default
    window, and what it does to false certification (the walk cells: any certificate)."""
    lines = [
        f"a longer cap instead, 300 s windows, block cells at SD 0.02 ({replicates} runs per cell): P(certify) at R = 1"
        f" under AR(1) 0.5 and independent blocks (blocks, hours on average), worst false certification at"
        f" {1 - MARGIN:.2f} over {', '.join(HOURS_FALSE)}:",
    ]
    rng = np.random.default_rng(seed)
    for h in hours:
        blocks = most_blocks(max_hours=h)

        def runs(noise: str, r: float, h: float = h, blocks: int = blocks) -> dict[str, np.ndarray]:
            d, _, slope, _ = generate_d(noise, r, 0.02, replicates, blocks, rng)
            return run_procedure(d, MARGIN, max_hours=h, slope=slope)

        power = []
        for noise in ("ar1-0.5", "gaussian"):
            got = runs(noise, 1.0)
            p = float(np.isin(got["verdict"], (NO_SLOWDOWN, SMALLER)).mean())
            power.append(
                f"{noise} {p:.3f} ({got['blocks'].mean():.1f} blocks, {got['blocks'].mean() * 600 / 3600:.1f} h)"
            )
        false = {
            noise: float(np.isin(runs(noise, 1 - MARGIN)["verdict"], (NO_SLOWDOWN, SMALLER)).mean())
            for noise in HOURS_FALSE
        }
        worst = max(false, key=lambda k: false[k])
        verdict = "ok" if false[worst] <= FALSE_CERT_GOAL else "ABOVE GOAL"
        lines.append(
            f"  --max-hours {h:g} ({blocks} blocks): "
            + ", ".join(power)
            + f"; worst false {false[worst]:.4f} ({worst}) {verdict}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000, help="runs per cell")
    parser.add_argument("--seed", type=int, default=20250)
    parser.add_argument("--hours-only", action="store_true", help="only what a longer --max-hours buys")
    args = parser.parse_args(argv)
    if not args.hours_only:
        print("\n".join(window_report(args.runs, args.seed, lambda done: print(f"... {done}", file=sys.stderr))))
    print("\n".join(hours_report(args.runs, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
