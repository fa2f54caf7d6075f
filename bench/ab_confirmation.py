"""A twin's confirmation of a published certificate (``arbiter.engine.abconfirm``), simulated
over fleets of an original run and its twins in every steady noise cell: its false
certification per node and fleet-wide, its power and its length against the run that earned
the certificate.  Printed by bench/ab_validity.py (``--confirm-replicates``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from ab_sim import (
    FALSE_CERT_GOAL,
    NO_SLOWDOWN,
    PILOT_BLOCKS,
    SDS,
    SLOWDOWN,
    SMALLER,
    STATIONARY,
    analyse_fixed,
    fmt,
    generate_d,
    most_blocks,
    run_procedure,
    size_runs,
)

from arbiter.engine import abconfirm, abstats

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
            result = analyse_fixed(np.concatenate([before, own], axis=1), margin, pilot=blocks, ends_test=False)
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
                f"{noise:>9} {sd:>5.2f} | {fmt(t['p_original'], 11)} {fmt(t['per_twin'], 7)}"
                f" {fmt(t['fleet_rate'], 7)} {fmt(t['p_any'], 7)} | {fmt(u['per_twin'], 12)}"
                f" {fmt(u['worst_twin'], 7)} {fmt(u['fleet_rate'], 7)} {fmt(u['p_any'], 7)} |"
                f" {fmt(p['p_adopt_given'], 10)} {p['confirm_blocks']:>7.2f} {p['run_blocks']:>7.2f}"
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
