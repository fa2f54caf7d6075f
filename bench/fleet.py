"""A fleet under real Slurm: how fast a protected program's phase reaches the node's jobs, and
Slurm's view of them.

    uv run python bench/fleet.py [--nodes 2] [--jobs 4] [--rounds 10] [--seed 1]

Needs root and the Debian packages slurmctld, slurmd, slurm-client and munge.  A cluster on
loopback (munged, slurmctld, one slurmd per node) with one arbiter daemon per node using the
``slurm`` translator; each node has a protected stand-in (a ``sleep`` the rule matches) whose
phase is read from a JSONL file under an ``immediate`` rule.  ``--jobs`` batch jobs per node
(``sbatch --requeue``) run ``sleep``.  Then, ``--rounds`` times, on a node chosen at random
(seeded): the phase turns on, and the bench polls until every job process on that node is
stopped (local) and until squeue shows each of its jobs ``S``; the phase turns off, and it polls
until they run and show ``R`` again.  It also samples, every 10 ms while the phase is on (3 s a
round, past Slurm's own SIGSTOP), whether any of that node's job processes is not stopped
(protected time with fleet work free to run on the node: goal 0 samples).  Then one job per
node is stopped through arbiter (``arbiter job stop``): the time until squeue shows it running
again with its restart count one higher.  Prints p50/p99.

Last, fleet throughput against an oracle (``--throughput-s``, twice: eviction off, then
``evict_after_s`` at ``--evict-after-s``, ``auto`` unless given, with ``evict_cost_s`` at ``--evict-cost-s``
(3 s: this cluster's requeue to running again), the daemons started again for each, the same
schedule both times, ``slurm.checkpoint_s`` and ``slurm.requeue_grace_s`` from
``--checkpoint-s`` and ``--requeue-grace-s``).  ``--queue`` batch jobs are in the fleet at once
(``sbatch --requeue --constraint=arbiter-admit``; one that ends is followed by a new one),
each ``--work-s`` seconds of work, at most ``--slots`` on a node; a job asks for
``--signal=B:USR1``, saves its work in a checkpoint file on that signal (and when it ends) and
carries on from it when run again.  Every 0.1 s the pass looks at the job processes on the
nodes whose protected program runs: one running there is within its grace when its job was
evicted at most ``checkpoint_s + requeue_grace_s`` (and a second) before, before the node saw
its protected program in the first 1.5 s of it, else outside (goal: 0).  A protected program (a rule with ``pause_fleet``) starts and
stops on each node at random (seeded: off for an exponential time of mean ``--free-s``, on
for one of mean ``--busy-s``).  The oracle knows when each node is free: at every moment it
runs as many of the jobs as the free nodes have slots for, moving them at no cost.  Printed:
the work the fleet kept and the jobs it finished, against the oracle's, the work kept against
the work run, and the looks at the protected nodes; and the work reachable at all, the oracle's
less this run's requeue-to-running p50 for each job it moves off a node that starts protecting.

One 60 s pass says little: from one run to the next, on one schedule, the share of the oracle
moves by 15 points or more (Slurm's scheduling passes, the box's load).  ``--seeds K`` runs the
passes on K schedules (seeds ``--seed`` to ``--seed + K - 1``, each drawn afresh from its seed
with the same mix), and prints each one's figures and then, per pass, the mean share of the
oracle with its spread (lowest to highest, and the standard deviation), the reachable share,
and the looks at the protected nodes over all of them.  ``--passes on`` runs the eviction pass
alone (the one a change to eviction moves), ``--requeue-rounds`` times the requeues more than
once, for their p99.  The defaults (one schedule, both passes, one requeue round) stay quick
for a test.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from arbiter_testing.reaction import write_phase
from arbiter_testing.rules import game_rule, own_sleep, phase_rule
from arbiter_testing.slurm import SlurmCluster, unavailable
from arbiter_testing.waiting import wait_until

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet_report import report
from fleet_throughput import ENDED, Pass, busy_schedule, restart_fleet, throughput

WAIT_S = 60.0
POLL_S = 0.002
#: how long the phase stays on each round
HOLD_S = 3.0


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def job_pids(cluster: SlurmCluster, job: int, node: str) -> list[int]:
    out = cluster.run("scontrol", "listpids", str(job), node, check=False)
    return [int(line.split()[0]) for line in out.splitlines()[1:] if line.split() and line.split()[0].isdigit()]


def squeue_states(cluster: SlurmCluster, jobs: list[int]) -> dict[int, str]:
    data = json.loads(cluster.run("squeue", "--json", "--jobs", ",".join(map(str, jobs))))
    return {j["job_id"]: j["job_state"] for j in data["jobs"] if j["job_id"] in jobs}


def adopted(cluster: SlurmCluster, node: str, job: int) -> bool:
    return any(j["id"] == f"slurm-{job}" for j in cluster.arbiter[node].status()["jobs"])


def node_pids(cluster: SlurmCluster, node: str, jobs: list[int]) -> list[int] | None:
    return [p for j in jobs for p in job_pids(cluster, j, node)] or None


def restarts(cluster: SlurmCluster, job: int) -> int:
    return int(cluster.jobs().get(job, {}).get("restart_cnt") or 0)


def running_again(cluster: SlurmCluster, job: int, before: int = 0) -> bool:
    j = cluster.jobs().get(job)
    return bool(j and j["job_state"] == "RUNNING" and j["restart_cnt"] > before)


def running(pids: list[int], since: float = 0.0) -> bool:
    """Whether any of these processes is not stopped (running or sleeping: free to run)."""
    free = [(p, s) for p in pids if (s := proc_state(p)) not in ("T", "t", "Z", "gone")]
    if free:
        print(f"  not stopped {(time.perf_counter() - since) * 1000:.0f} ms into the phase: {free}", flush=True)
    return bool(free)


def set_phase(path: Path, on: bool) -> float:
    write_phase(path, "on" if on else "off")
    return time.perf_counter()


def evict_after(text: str) -> float | str:
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither seconds nor auto") from None


def passes_arg(text: str) -> tuple[str, ...]:
    tags = tuple(t.strip() for t in text.split(",") if t.strip())
    if not tags or any(t not in ("off", "on") for t in tags):
        raise argparse.ArgumentTypeError(f"{text!r}: name the passes as off, on or off,on")
    return tags


def protect_rule(node: str, events: Path, marker: str) -> dict[str, Any]:
    return phase_rule(f"stand-in-{node}", marker, events, scope="all")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=4, help="batch jobs per node")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="throughput schedules to run the passes on (seeds --seed to --seed + K - 1); the mean and spread are printed",
    )
    ap.add_argument(
        "--passes",
        type=passes_arg,
        default=("off", "on"),
        help="which throughput passes to run on each schedule: off,on (the default), on or off",
    )
    ap.add_argument(
        "--requeue-rounds",
        type=int,
        default=1,
        help="how many times one job per node, then three at once, are stopped and timed to running again",
    )
    ap.add_argument(
        "--requeue",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also stop one job per node and time its requeue (the default)",
    )
    ap.add_argument("--throughput-s", type=float, default=60.0, help="each throughput pass's length (0: none)")
    ap.add_argument("--work-s", type=float, default=8.0, help="the work in each throughput job, in seconds")
    ap.add_argument("--slots", type=int, choices=(1, 2, 4), default=2, help="throughput jobs a node runs at once")
    ap.add_argument("--free-s", type=float, default=6.0, help="mean time a node's protected program is off")
    ap.add_argument("--busy-s", type=float, default=14.0, help="mean time it runs")
    ap.add_argument(
        "--evict-after-s",
        type=evict_after,
        default="auto",
        help="evict_after_s in the second pass: seconds, or auto (the default, as fleet-slurm.md recommends)",
    )
    ap.add_argument(
        "--evict-cost-s",
        type=float,
        default=3.0,
        help="evict_cost_s for auto: what a requeue costs a job on this loopback cluster (measured below)",
    )
    ap.add_argument(
        "--checkpoint-s",
        type=float,
        default=1.0,
        help="slurm.checkpoint_s: the longest an evicted job runs on after its checkpoint signal",
    )
    ap.add_argument(
        "--requeue-grace-s",
        type=float,
        default=2.0,
        help="slurm.requeue_grace_s: how long an evicted job's processes may take to end after Slurm's SIGTERM",
    )
    ap.add_argument(
        "--queue",
        type=int,
        default=0,
        help="throughput jobs in the fleet at once (default: one node's slots fewer than all)",
    )
    args = ap.parse_args(argv)
    args.queue = args.queue or args.slots * (args.nodes - 1) or args.slots
    why = unavailable()
    if why:
        print(f"cannot run: {why}")
        return 2
    names = [f"n{i + 1}" for i in range(args.nodes)]
    # a SIGTERM (a timeout) ends the run through the cleanup below, not around it
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    try:
        return run(args, names)
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args: argparse.Namespace, names: list[str]) -> int:
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="arbiter-fleet-"))
    cluster = SlurmCluster(root, names)
    stand_ins: list[subprocess.Popen[bytes]] = []
    local: list[float] = []
    in_slurm: list[float] = []
    back_local: list[float] = []
    back_slurm: list[float] = []
    requeue: list[float] = []
    requeue3: list[float] = []
    ran_while_protected = 0
    samples_protected = 0
    runs: list[tuple[int, dict[str, list[tuple[float, float]]], dict[str, Pass]]] = []  # (seed, schedule, passes)
    try:
        cluster.start()
        events: dict[str, Path] = {}
        for i, name in enumerate(names):
            events[name] = root / f"phase-{name}.jsonl"
            events[name].touch()
            marker = own_sleep(995000 + i)
            node = cluster.start_arbiter(name, translators={"pause": ["slurm"], "terminate": ["slurm"]}, tick_s=1.0)
            node.add_rule(f"stand-in-{name}", protect_rule(name, events[name], marker))
            node.add_rule(f"game-{name}", game_rule(f"game-{name}", own_sleep(985000 + i)))
            stand_ins.append(subprocess.Popen(marker.split()))
        jobs = {
            name: [cluster.sbatch("sleep 3000\n", f"--nodelist={name}", "--requeue") for _ in range(args.jobs)]
            for name in names
        }
        pids: dict[str, list[int]] = {}
        for name in names:
            for job in jobs[name]:
                wait_until(partial(adopted, cluster, name, job), WAIT_S, f"slurm-{job} adopted on {name}")
            pids[name] = wait_until(partial(node_pids, cluster, name, jobs[name]), WAIT_S, f"{name}'s job processes")
        time.sleep(2.0)  # the rules' processes matched on a tick before the first phase
        print(f"{sum(len(p) for p in pids.values())} job processes on {len(names)} nodes; phase rounds:", flush=True)
        for r in range(args.rounds):
            name = rng.choice(names)
            started = set_phase(events[name], True)
            while not all(proc_state(p) in "TtZ" or proc_state(p) == "gone" for p in pids[name]):
                time.sleep(POLL_S)
            local.append((time.perf_counter() - started) * 1000)
            while not all(s == "SUSPENDED" for s in squeue_states(cluster, jobs[name]).values()):
                samples_protected += 1
                ran_while_protected += running(pids[name], started)
                time.sleep(0.01)
            in_slurm.append((time.perf_counter() - started) * 1000)
            held_until = time.perf_counter() + HOLD_S  # past Slurm's own SIGSTOP, ~2 s after its SIGTSTP
            while time.perf_counter() < held_until:
                samples_protected += 1
                ran_while_protected += running(pids[name], started)
                time.sleep(0.01)
            started = set_phase(events[name], False)
            while any(proc_state(p) in "Tt" for p in pids[name]):
                time.sleep(POLL_S)
            back_local.append((time.perf_counter() - started) * 1000)
            while not all(s == "RUNNING" for s in squeue_states(cluster, jobs[name]).values()):
                time.sleep(0.01)
            back_slurm.append((time.perf_counter() - started) * 1000)
            print(f"round {r + 1}: {name} stopped in {local[-1]:.1f} ms, S in {in_slurm[-1]:.0f} ms", flush=True)
        for _ in range(args.requeue_rounds if args.requeue else 0):
            for name in names:
                job = jobs[name][0]
                again = partial(running_again, cluster, job, restarts(cluster, job))
                started = time.perf_counter()
                cluster.arbiter[name].call("job.stop", id=f"slurm-{job}")
                wait_until(again, WAIT_S, f"job {job} running again", poll_s=0.05)
                requeue.append((time.perf_counter() - started) * 1000)
            for name in names if args.jobs >= 4 else ():
                three = jobs[name][1:4]  # three jobs of one node stopped at once
                before = {job: restarts(cluster, job) for job in three}
                started = time.perf_counter()
                for job in three:
                    cluster.arbiter[name].call("job.stop", id=f"slurm-{job}")
                for job in three:
                    again = partial(running_again, cluster, job, before[job])
                    wait_until(again, WAIT_S, f"job {job} running again", poll_s=0.05)
                    requeue3.append((time.perf_counter() - started) * 1000)
        if args.throughput_s > 0:
            every = [j for js in jobs.values() for j in js]
            cluster.run("scancel", *map(str, every), check=False)  # their CPUs are the passes' slots
            wait_until(
                lambda: all(j.get("job_state") in ENDED for i, j in cluster.jobs().items() if i in every),
                WAIT_S,
                "the phase rounds' jobs ended",
                poll_s=0.2,
            )
            grace = args.checkpoint_s + args.requeue_grace_s
            for seed in range(args.seed, args.seed + args.seeds):
                # each schedule from its own seed: the same whatever the phase rounds drew
                schedule = busy_schedule(random.Random(seed), names, args.throughput_s, args.free_s, args.busy_s)
                passes: dict[str, Pass] = {}
                for tag in args.passes:
                    evict = args.evict_after_s if tag == "on" else None
                    slurm = {"checkpoint_s": args.checkpoint_s, "requeue_grace_s": args.requeue_grace_s}
                    restart_fleet(cluster, names, slurm, evict_after_s=evict, evict_cost_s=args.evict_cost_s)
                    passes[tag] = throughput(cluster, names, args, schedule, f"{tag}-{seed}", grace_s=grace)
                    print(f"throughput pass, seed {seed}, evict_after_s {evict}: {passes[tag]}", flush=True)
                runs.append((seed, schedule, passes))
    finally:
        for proc in stand_ins:
            proc.kill()
            proc.wait()
        cluster.close()
    shutil.rmtree(root, ignore_errors=True)  # a run that failed leaves it, with each daemon's and slurmd's log
    print(f"{args.nodes} nodes x {args.jobs} jobs, {args.rounds} phase rounds (seed {args.seed})")
    print(
        f"phase on -> the node's job processes stopped (local): p50 {pct(local, 0.5):.1f} ms, p99 {pct(local, 0.99):.1f} ms"
    )
    print(f"phase on -> every job S in squeue: p50 {pct(in_slurm, 0.5):.0f} ms, p99 {pct(in_slurm, 0.99):.0f} ms")
    print(f"phase off -> processes running: p50 {pct(back_local, 0.5):.1f} ms, p99 {pct(back_local, 0.99):.1f} ms")
    print(f"phase off -> every job R in squeue: p50 {pct(back_slurm, 0.5):.0f} ms, p99 {pct(back_slurm, 0.99):.0f} ms")
    if args.requeue:
        print(f"stop -> requeued job running again: p50 {pct(requeue, 0.5):.0f} ms, p99 {pct(requeue, 0.99):.0f} ms")
        if requeue3:
            print(
                f"three jobs of a node stopped at once -> each running again: p50 {pct(requeue3, 0.5):.0f} ms, "
                f"p99 {pct(requeue3, 0.99):.0f} ms"
            )
    print(
        f"samples (every 10 ms) with the phase on and a job process of its node not stopped: "
        f"{ran_while_protected} of {samples_protected}"
    )
    if runs:
        report(args, names, runs, pct(requeue, 0.5) / 1000 if requeue else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
