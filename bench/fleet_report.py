"""What ``bench/fleet.py`` prints of its throughput passes: each schedule's figures, then, per
pass, the mean share of the oracle over the schedules with its spread (see that script's
description)."""

from __future__ import annotations

import argparse
import statistics

from fleet_throughput import Pass, free_share, oracle, reachable

Schedule = dict[str, list[tuple[float, float]]]


def spread(values: list[float]) -> str:
    """A share's mean, lowest to highest and standard deviation, in percent."""
    if not values:
        return "none"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    low, high = 100 * min(values), 100 * max(values)
    return f"mean {100 * statistics.fmean(values):.0f}% ({low:.0f}% to {high:.0f}%, sd {100 * sd:.0f})"


def evict_name(args: argparse.Namespace, tag: str) -> str:
    if tag == "off":
        return "off"
    value = args.evict_after_s
    return value if isinstance(value, str) else f"{value:g} s"


def report(
    args: argparse.Namespace, names: list[str], runs: list[tuple[int, Schedule, dict[str, Pass]]], move_s: float | None
) -> None:
    """Each schedule's passes, then the passes over all schedules.  ``move_s`` is this run's
    requeue to running again (its p50), for the work reachable at all."""
    grace = args.checkpoint_s + args.requeue_grace_s
    shares: dict[str, list[float]] = {}
    kept_share: dict[str, list[float]] = {}
    outside: dict[str, int] = {}
    in_grace: dict[str, int] = {}
    looks: dict[str, int] = {}
    idle: dict[str, dict[str, float]] = {}
    floors: list[float] = []
    # pooled over the schedules (a schedule where the oracle does little weighs little): the work
    # kept, and the work reachable, against the oracle's, each summed
    best_sum = floor_sum = 0.0
    kept_sum: dict[str, float] = {}
    beside_sum: dict[str, float] = {}
    for seed, schedule, passes in runs:
        best = oracle(schedule, args.throughput_s, args.slots, args.queue)
        best_sum += best
        oracle_jobs = int(best // args.work_s)
        print(
            f"throughput over {args.throughput_s:g} s (schedule seed {seed}), {len(names)} nodes x {args.slots} slots, "
            f"{args.queue} jobs of {args.work_s:g} s in the fleet at once, protected programs running "
            f"{100 * (1 - free_share(schedule, args.throughput_s)):.0f}% of node time: "
            f"the oracle does {best:.0f} s of work, {oracle_jobs} jobs"
        )
        if move_s is not None:
            # Slurm's own floor: each job moved off a node that starts protecting loses at least
            # its requeue to running again, placed at once (this run's quickest half)
            most, moves = reachable(schedule, args.throughput_s, args.slots, args.queue, move_s)
            floors.append(most / best)
            floor_sum += most
            print(
                f"  reachable at all with Slurm's requeue to running again ({move_s:.1f} s, the p50 above) for "
                f"each of the {moves} jobs the oracle moves off a node that starts protecting: {most:.0f} s of "
                f"work ({100 * most / best:.0f}% of the oracle's)"
            )
        for tag, p in passes.items():
            shares.setdefault(tag, []).append(p.kept / best)
            kept_sum[tag] = kept_sum.get(tag, 0.0) + p.kept
            beside_sum[tag] = beside_sum.get(tag, 0.0) + min(p.beside_s, p.kept)
            kept_share.setdefault(tag, []).append(p.kept / max(p.ran, 1e-9))
            outside[tag] = outside.get(tag, 0) + len(p.outside)
            in_grace[tag] = in_grace.get(tag, 0) + p.in_grace
            looks[tag] = looks.get(tag, 0) + p.samples
            for why, s in p.idle.items():
                idle.setdefault(tag, {})[why] = idle.get(tag, {}).get(why, 0.0) + s / len(runs)
            print(
                f"  evict_after_s {evict_name(args, tag)}: {p.kept:.0f} s of work ({100 * p.kept / best:.0f}% of the "
                f"oracle's), {p.finished} jobs ({100 * p.finished / max(oracle_jobs, 1):.0f}%), {p.requeued} requeued; "
                f"work kept {p.kept:.0f} s of {p.ran:.0f} s run ({100 * p.kept / max(p.ran, 1e-9):.0f}%)"
            )
            ran = max(p.evicted_ran_s, default=0.0)
            print(
                f"    protected nodes looked at {p.samples} times (every 0.1 s): a fleet process running there "
                f"{len(p.outside)} times outside any grace, {p.in_grace} within an evicted job's grace "
                f"({grace:g} s: checkpoint_s {args.checkpoint_s:g} + requeue_grace_s {args.requeue_grace_s:g}; "
                f"longest seen {ran:.1f} s after its eviction), {p.reacting} before the node saw its protected program; "
                f"fleet processes ran {p.beside_s:.1f} s beside a protected program in all"
            )
            if p.idle:
                print(
                    f"    slot-seconds the oracle worked and the fleet did not ({best - p.kept:.0f} s short in all), "
                    "where the fleet's jobs were: "
                    + ", ".join(f"{why} {s:.0f} s" for why, s in sorted(p.idle.items(), key=lambda i: -i[1]))
                )
            for what in p.outside[:10]:
                print(f"      outside: {what}")
    seeds = [seed for seed, _, _ in runs]
    print(f"over {len(runs)} schedule(s) (seeds {seeds[0]} to {seeds[-1]}), {args.throughput_s:g} s each:")
    if floors:
        print(
            f"  reachable at all: {100 * floor_sum / max(best_sum, 1e-9):.0f}% of the oracle's work pooled; "
            f"per schedule {spread(floors)}"
        )
    for tag, values in shares.items():
        print(
            f"  evict_after_s {evict_name(args, tag)}: {100 * kept_sum[tag] / max(best_sum, 1e-9):.0f}% of the "
            f"oracle's work pooled ({kept_sum[tag]:.0f} s of {best_sum:.0f} s); per schedule {spread(values)}; "
            "work kept of work run "
            f"{spread(kept_share[tag])}; a fleet process on a protected node {outside[tag]} times outside any grace, "
            f"{in_grace[tag]} within it, of {looks[tag]} looks"
        )
        honest = kept_sum[tag] - beside_sum[tag]
        print(
            f"    without any work run beside a protected program (at most {beside_sum[tag]:.0f} s of it counted "
            f"above, work the oracle never does): {100 * honest / max(best_sum, 1e-9):.0f}% of the oracle's work pooled"
        )
        if idle.get(tag):
            print(
                "    slot-seconds short per schedule, where the fleet's jobs were: "
                + ", ".join(f"{why} {s:.1f} s" for why, s in sorted(idle[tag].items(), key=lambda i: -i[1]))
            )
