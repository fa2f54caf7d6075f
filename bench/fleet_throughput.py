"""The throughput passes of ``bench/fleet.py``: batch jobs that checkpoint their work, a
protected program starting and stopping at random on each node, and the oracle that knows
when each node is free (see that script's description)."""

from __future__ import annotations

import argparse
import itertools
import random
import subprocess
import sys
import time
from typing import Any

from arbiter_testing.rules import own_sleep
from arbiter_testing.slurm import SlurmCluster
from arbiter_testing.waiting import wait_until

WAIT_S = 60.0
#: how often a throughput pass replaces the jobs that ended
TOP_UP_S = 0.25
ENDED = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"})
#: a throughput job: counts the seconds it ran in a checkpoint file (a gap longer than a few
#: steps was a pause, and counts one step), carries on from it when run again, ends when done
WORK = """\
import os, sys, time
path, total, step = sys.argv[1], float(sys.argv[2]), 0.1
try:
    with open(path) as fh:
        done = float(fh.read())
except (OSError, ValueError):
    done = 0.0
print(f"restart={os.environ.get('SLURM_RESTART_COUNT', '0')} from={done:.1f}", flush=True)
last = time.monotonic()
while done < total:
    time.sleep(step)
    now = time.monotonic()
    done += now - last if now - last < 3 * step else step
    last = now
    with open(path + ".tmp", "w") as fh:
        fh.write(f"{done:.3f}")
    os.replace(path + ".tmp", path)
"""


def busy_schedule(
    rng: random.Random, names: list[str], seconds: float, free_s: float, busy_s: float
) -> dict[str, list[tuple[float, float]]]:
    """When each node's protected program runs: (start, end) spans within ``seconds``."""
    out = {}
    for name in names:
        t, spans = 0.0, []
        while True:
            t += rng.expovariate(1 / free_s)
            if t >= seconds:
                break
            end = min(seconds, t + max(1.0, rng.expovariate(1 / busy_s)))
            spans.append((t, end))
            t = end
        out[name] = spans
    return out


def oracle(schedule: dict[str, list[tuple[float, float]]], seconds: float, slots: int, queue: int) -> float:
    """The work an oracle that knows when each node is free does with ``queue`` jobs in the
    fleet: at every moment it runs as many of them as the free nodes have slots for."""
    points = sorted({0.0, seconds} | {t for spans in schedule.values() for span in spans for t in span})
    work = 0.0
    for a, b in itertools.pairwise(points):
        mid = (a + b) / 2
        free = sum(1 for spans in schedule.values() if not any(start <= mid < end for start, end in spans))
        work += min(queue, slots * free) * (b - a)
    return work


def free_share(schedule: dict[str, list[tuple[float, float]]], seconds: float) -> float:
    """The share of node time no protected program runs."""
    busy = sum(end - start for spans in schedule.values() for start, end in spans)
    return 1 - busy / (seconds * len(schedule))


def restart_fleet(cluster: SlurmCluster, names: list[str], **config: Any) -> None:
    for name in names:
        node = cluster.arbiter[name]
        node.stop()
        node.config.update(config)
        node.write_config()
        cluster.restart_arbiter(name)
    wait_until(
        lambda: all("arbiter-admit" in cluster.features().get(n, set()) for n in names),
        WAIT_S,
        "arbiter-admit on every node",
        poll_s=0.2,
    )


def submit(cluster: SlurmCluster, script: str, options: tuple[str, ...]) -> int | None:
    """A new job, or None while no node admits GPU work: Slurm refuses a constraint no node's
    active features meet (the next top-up tries again), as it would a user's."""
    try:
        return cluster.sbatch(script, *options)
    except AssertionError as exc:
        if "Requested node configuration is not available" in str(exc):
            return None
        raise


def throughput(
    cluster: SlurmCluster,
    names: list[str],
    args: argparse.Namespace,
    schedule: dict[str, list[tuple[float, float]]],
    tag: str,
) -> tuple[float, int, int]:
    """One pass: (seconds of work done, jobs finished, requeues) in ``args.throughput_s``."""
    folder = cluster.root / f"throughput-{tag}"
    folder.mkdir()
    (folder / "work.py").write_text(WORK)
    script = f"exec {sys.executable} {folder / 'work.py'} {folder}/work-$SLURM_JOB_ID {args.work_s}\n"
    options = ("--requeue", "--constraint=arbiter-admit", f"--cpus-per-task={4 // args.slots}")
    jobs = [cluster.sbatch(script, *options, "--hold") for _ in range(args.queue)]
    events = sorted(
        (t, name, on) for name, spans in schedule.items() for span in spans for t, on in zip(span, (1, 0), strict=True)
    )
    games: dict[str, subprocess.Popen[bytes]] = {}
    try:
        cluster.run("scontrol", "release", ",".join(map(str, jobs)))
        start = time.perf_counter()
        topped_up = 0.0
        while (now := time.perf_counter() - start) < args.throughput_s:
            while events and events[0][0] <= now:
                _, name, on = events.pop(0)
                if on:
                    games[name] = subprocess.Popen(own_sleep(985000 + names.index(name)).split())
                else:
                    game = games.pop(name)
                    game.kill()
                    game.wait()
            if now - topped_up >= TOP_UP_S:  # a job that ended is followed by a new one
                topped_up = now
                seen = cluster.jobs()
                live = sum(1 for j in jobs if seen.get(j, {}).get("job_state") not in ENDED)
                jobs += [j for _ in range(args.queue - live) if (j := submit(cluster, script, options)) is not None]
            time.sleep(0.02)
        done = []
        for path in folder.glob("work-*"):
            try:
                done.append(min(float(path.read_text()), args.work_s))
            except ValueError:
                continue
        seen = cluster.jobs()
        requeued = sum(seen[j]["restart_cnt"] for j in jobs if j in seen)
    finally:
        for proc in games.values():
            proc.kill()
        for proc in games.values():
            proc.wait()
        cluster.run("scancel", *map(str, jobs), check=False)
        wait_until(
            lambda: all(j.get("job_state") in ENDED for i, j in cluster.jobs().items() if i in jobs),
            WAIT_S,
            "the pass's jobs ended",
            poll_s=0.2,
            ignore=(AssertionError,),
        )
    return sum(done), sum(1 for d in done if d >= args.work_s), requeued
