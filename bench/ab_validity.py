"""Does the paired ON/OFF procedure keep its promises?  A simulation of the whole run as the
harness does it: pilot, sizing, refusal, the remaining blocks, the verdict.

    uv run python bench/ab_validity.py [--runs 10000] [--workers 2] [--seed 20250] [--margin 0.02]

(about 40 s at the default 10,000 runs per cell on 2 busy cores; ``--runs 2000`` to iterate;
``--alternatives 4000`` prices other ways of judging the run's ends, a few minutes more;
``--windows 10000`` prices the window length on noise in continuous time, ``bench/ab_window.py``,
and what a longer --max-hours buys, about ten minutes more)

1. A pilot of 4 blocks, each giving d_i = ln(ON_i / OFF_i).
2. n = what ``abstats.blocks_needed`` says for the pilot; the run totals max(--blocks, 4 + n)
   blocks.  A run whose n is None, or whose planned hours exceed --max-hours, is refused after
   the pilot (it never certifies; its 4 pilot blocks are what it used).
3. The remaining blocks are run and analysed as ``abstats.analyse`` does: the pilot only in the
   autocorrelation estimate, the rest in R and its drift-robust interval, and the verdict; a
   certificate is withheld when the change statistic over every block says the effect moved, or
   when the effect over the first or last quarter of every block does not clear 1 − margin.
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
48 + a random phase))).  There a run's true R is the mean effect over its analysed blocks, and
P(f,2nd) counts a certificate false when the effect over the second half of them was at or below
1 − margin on average.  Last, at R = 1 − margin only, the random walk over each other steady
model but the trend (``walk-S/BASE``): the effect began at the margin, so P(f,any) counts every
certificate false (a certificate vouches for the effect throughout the run); it is P(certify) in
every walk cell at 1 − margin.

Per cell: coverage for the true R, over the runs that were not refused, of the interval the
verdict used (99 % at a first look, 91 % at the last, 90 % at a run's only look; goal ≥ 0.85, and
≥ 0.88 for independent blocks) and of the 90 % interval at the run's end (0.88–0.92 for
independent blocks, the calibration of a single look; where a run stops depends on its data, so
it may read a little under), P(certify), P(slowdown), P(refused), P(ext) (the run went on past its
first look) and the blocks used.  Then the false certification rate at R = 1 − margin (goal ≤
0.05 in every cell; where the effect moves, P(f,2nd) in every cell and P(f,any) in every walk
cell), how often a certificate is withheld as "the effect changed" where nothing moves,
P(certify) at R = 1 (goal ≥ 0.80 at SD 0.02, gaussian, and under AR(1) drift with phi = 0.5,
within the run's hours), and the prices: the analysed blocks for a power of 0.80 at R = 1, SD
0.02, one look, with the paired t-interval, the drift-robust one, with the change test and with
the ends judged too, on independent blocks and under AR(1) drift with phi = 0.5.

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
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_confirmation import confirmation_report
from ab_price import alternatives, price
from ab_sim import (  # the procedure's parts the bench's tests read from here too
    CHANGED,
    COVERAGE_FLOOR,
    COVERAGE_GOAL,
    FALSE_CERT_GOAL,
    INCONCLUSIVE,
    INDEPENDENT,
    MARGIN,
    MAX_HOURS,
    MOVING,
    NO_SLOWDOWN,
    NOISES,
    PILOT_BLOCKS,
    PLANNED_BLOCKS,
    POWER_GOAL,
    RATIOS,
    REFUSED,
    SDS,
    SLOWDOWN,
    SMALLER,
    STATIONARY,
    WALK_BASES,
    WALK_STEPS,
    WALKS,
    WASHOUT_S,
    WINDOW_S,
    fmt,
    generate_d,
    most_blocks,
    run_procedure,
)
from ab_window import hours_report, window_report

from arbiter.engine import abstats


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
    moving = path if noise in MOVING or noise in WALKS else None
    cell = summarise(runs, r, moving, margin, pilot_blocks)
    # a walk from 1 − margin: the effect was at the margin where the run began, so any certificate
    # is false (it vouches for the effect throughout the run)
    start = noise.startswith("walk-") and math.isclose(r, 1 - margin)
    return {
        "r": r,
        "sd": sd,
        "noise": noise,
        "replicates": replicates,
        "p_false_start": cell["p_certify"] if start else math.nan,
        **cell,
    }


def _moving_lines(cells: Sequence[dict[str, Any]], floor: float) -> list[str]:
    """False certification where the effect moves, and what withholding costs where it does not."""
    lines = [
        f"the effect moves, from the cell's R: second-half false certification P(f,2nd), a certificate while the effect"
        f" over the second half of the analysed blocks was at or below {floor:.2f} (goal ≤ {FALSE_CERT_GOAL:.2f} in every"
        f" cell, every R); P(certify) from R = {floor:.2f}:",
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
    lines.extend(_walk_lines(cells, floor))
    lines.append(
        "withheld as 'the effect changed' where it does not move, at R = 1.00 (the change test's and the ends' own rate):"
    )
    for noise in STATIONARY:
        group = [c for c in cells if c["noise"] == noise and math.isclose(c["r"], 1.0)]
        if group:
            lines.append(f"  {noise:>9}: " + ", ".join(f"SD {c['sd']:.2f} {c['p_withheld']:.4f}" for c in group))
    return lines


def _walk_lines(cells: Sequence[dict[str, Any]], floor: float) -> list[str]:
    """The walk from 1 − margin over every steady noise model: any certificate is false, P(f,any)."""
    lines = [
        f"a random walk of the effect from R = {floor:.2f}, over each steady noise model: false certification"
        f" P(f,any), any certificate (the effect began at the margin; goal ≤ {FALSE_CERT_GOAL:.2f} in every cell);"
        f" per step (× the block SD), SD {' / '.join(f'{sd:.2f}' for sd in SDS)}:",
    ]
    walked = [c for c in cells if not math.isnan(c["p_false_start"])]
    for step in WALK_STEPS:
        group = [c for c in walked if c["noise"].removeprefix("walk-").partition("/")[0] == step]
        if not group:
            continue
        worst = max(group, key=lambda c: c["p_false_start"])
        verdict = "ok" if worst["p_false_start"] <= FALSE_CERT_GOAL else "ABOVE GOAL"
        lines.append(
            f"  step {step:>4}: worst cell {worst['p_false_start']:.4f} ({worst['noise']}, SD {worst['sd']:.2f}) {verdict}"
        )
        for base in WALK_BASES:
            row = [
                c
                for c in group
                if c["noise"].partition("/")[2] in (base, "") and (base == "gaussian") == ("/" not in c["noise"])
            ]
            if row:
                lines.append(f"    {base:>9}: " + " / ".join(f"{c['p_false_start']:.4f}" for c in row))
    return lines


def report(cells: Sequence[dict[str, Any]], margin: float, window: float = WINDOW_S) -> list[str]:
    lines = [
        f"{'R':>5} {'SD':>5} {'noise':>9} {'coverage':>8} {'cov 90%':>8} {'P(cert)':>8} {'P(f,2nd)':>8} {'P(f,any)':>8} {'P(withh)':>8}"
        f" {'P(slow)':>8} {'P(refus)':>8} {'P(ext)':>8} {'mean blk':>8} {'max blk':>7}",
    ]
    for c in cells:
        if "/" in c["noise"]:
            continue  # the walk over other noise: its own table below
        lines.append(
            f"{c['r']:>5.2f} {c['sd']:>5.2f} {c['noise']:>9} {fmt(c['coverage'])} {fmt(c['coverage90'])} {fmt(c['p_certify'])}"
            f" {fmt(c['p_false'])} {fmt(c['p_false_start'])} {fmt(c['p_withheld'])} {fmt(c['p_slowdown'])} {fmt(c['p_refused'])}"
            f" {fmt(c['p_extended'])} {c['mean_blocks']:>8.2f} {c['max_blocks']:>7d}",
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
        "--alternatives", type=int, default=0, help="runs per cell pricing other ways to judge the ends; 0: none"
    )
    parser.add_argument(
        "--windows",
        type=int,
        default=0,
        help="runs per cell pricing the window length on noise in continuous time, and a longer cap; 0: none",
    )
    parser.add_argument(
        "--confirm-replicates", type=int, default=4_000, help="fleets per cell of the twins' confirmation; 0: none"
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    # the moving cells after the steady ones, so each steady cell keeps its stream as the grid grows
    grid = [(r, sd, noise) for models in (STATIONARY, MOVING) for r in RATIOS for sd in SDS for noise in models]
    # then the walk over the other steady models, from 1 − margin only (its measure is there)
    grid += [(round(1 - args.margin, 10), sd, noise) for noise in WALKS if "/" in noise for sd in SDS]
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
    if args.alternatives > 0:
        print("\n".join(alternatives(args.alternatives, args.seed, args.margin)))
    if args.windows > 0:
        print("\n".join([*window_report(args.windows, args.seed), *hours_report(args.windows, args.seed)]))
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
