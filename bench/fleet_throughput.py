"""The throughput passes of ``bench/fleet.py``: batch jobs that checkpoint their work, a
protected program starting and stopping at random on each node, and the oracle that knows
when each node is free (see that script's description)."""

from __future__ import annotations

import argparse
import itertools
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arbiter_testing.rules import own_sleep
from arbiter_testing.slurm import SlurmCluster
from arbiter_testing.waiting import wait_until

WAIT_S = 60.0
#: how often a throughput pass replaces the jobs that ended
TOP_UP_S = 0.25
#: how often a throughput pass looks at the job processes of the protected nodes
SAMPLE_S = 0.1
#: the most one look weighs: the first look after a protected program started follows a pause
MAX_GAP_S = 0.5
#: how long a node takes to see its protected program start (a tick, and the decision after it)
REACT_S = 1.5
#: how long after an eviction's first step (its job continued, to save its work and end) the
#: daemon's timeline says the job is stopped: a process seen running that much before counts
STOP_SAID_S = 0.5
ENDED = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"})
#: a throughput job: works in steps of 0.1 s (a gap longer than a few steps was a pause, and
#: counts one step), saves what it has done to its checkpoint file on SIGUSR1 (the signal its
#: script asks for, as a Slurm job that checkpoints before preemption does) and then requeues
#: itself (``scontrol requeue $SLURM_JOB_ID``, as PyTorch Lightning's auto-requeue and the usual
#: ``trap ... USR1`` scripts do), saves it too when it ends, and carries on from that file when
#: run again; what it has run in all, kept or not, and where its work stands, it writes to a
#: file of its own run
WORK = """\
import os, signal, subprocess, sys, time
path, total, step = sys.argv[1], float(sys.argv[2]), 0.1
try:
    with open(path) as fh:
        done = float(fh.read())
except (OSError, ValueError):
    done = 0.0
start = done
ran = f"{path}.ran-{os.environ.get('SLURM_RESTART_COUNT', '0')}"
print(f"restart={os.environ.get('SLURM_RESTART_COUNT', '0')} from={done:.1f}", flush=True)

def save(*_):
    with open(path + ".tmp", "w") as fh:
        fh.write(f"{done:.3f}")
    os.replace(path + ".tmp", path)

def save_and_requeue(*_):
    save()
    subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=False)

signal.signal(signal.SIGUSR1, save_and_requeue)
last = time.monotonic()
while done < total:
    time.sleep(step)
    now = time.monotonic()
    done += now - last if now - last < 3 * step else step
    last = now
    with open(ran, "w") as fh:
        fh.write(f"{done - start:.3f} {done:.3f}")
save()
"""
#: the checkpoint signal a throughput job asks for in its script
SIGNAL_LINE = "#SBATCH --signal=B:USR1@30\n"


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


def reachable(
    schedule: dict[str, list[tuple[float, float]]], seconds: float, slots: int, queue: int, move_s: float
) -> tuple[float, int]:
    """The work reachable at all where moving a job costs ``move_s`` (Slurm's requeue to running
    again, at its quickest), and how many moves that takes: the oracle's placement, each job on a
    node whose protected program starts moved to a free slot where one is left, losing
    ``move_s`` of work, or less where its own node frees sooner (it may as well wait there) or
    the pass ends first.  Placing a job on a node that frees is taken as free of cost, so this
    is an upper bound of what any fleet on this Slurm does with this schedule."""
    points = sorted({0.0, seconds} | {t for spans in schedule.values() for span in spans for t in span})
    placed = dict.fromkeys(schedule, 0)
    lost, moves = 0.0, 0
    for a, b in itertools.pairwise(points):
        mid = (a + b) / 2
        busy = {n: end for n, spans in schedule.items() for start, end in spans if start <= mid < end}
        displaced = sorted(min(end - a, seconds - a) for n, end in busy.items() for _ in range(placed[n]))
        for n in busy:
            placed[n] = 0
        kept = sum(placed.values())
        waiting = queue - kept - len(displaced)
        left = queue - kept
        for n in placed:
            if n not in busy:
                take = min(slots - placed[n], left)
                placed[n] += take
                left -= take
        # a free slot goes to a job that waited first (free of cost here), then to the displaced
        # ones that cost least to move: each loses its move, or its wait on its own node where
        # that is shorter (the free slot stays empty meanwhile)
        moved = max(0, queue - left - kept - waiting)
        lost += sum(min(move_s, rest) for rest in displaced[:moved])
        moves += moved
    return oracle(schedule, seconds, slots, queue) - lost, moves


def free_share(schedule: dict[str, list[tuple[float, float]]], seconds: float) -> float:
    """The share of node time no protected program runs."""
    busy = sum(end - start for spans in schedule.values() for start, end in spans)
    return 1 - busy / (seconds * len(schedule))


def restart_fleet(cluster: SlurmCluster, names: list[str], slurm: dict[str, Any] | None = None, **config: Any) -> None:
    """Every node's daemon started again with ``config`` and ``slurm`` in its ``slurm:`` section."""
    for name in names:
        node = cluster.arbiter[name]
        node.stop()
        node.config.update(config)
        node.config["slurm"] = {**(node.config.get("slurm") or {}), **(slurm or {})}
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


@dataclass
class Pass:
    """What one throughput pass did."""

    kept: float  # seconds of work saved (the jobs' checkpoints)
    ran: float  # seconds of work run, kept or lost
    finished: int
    requeued: int
    samples: int = 0  # looks at the protected nodes' job processes
    outside: list[str] = field(default_factory=list)  # a fleet process running there, outside any grace
    in_grace: int = 0  # ... within an evicted job's grace
    reacting: int = 0  # ... before the node saw its protected program start (a tick)
    #: seconds of fleet processes running beside a protected program (each look weighs the time
    #: since the look before): work the oracle never does, though a checkpoint may keep it
    beside_s: float = 0.0
    evicted_ran_s: list[float] = field(default_factory=list)  # per eviction: how long after it a process ran there
    idle: dict[str, float] = field(default_factory=dict)  # slot-seconds the oracle works and the fleet does not, by why


def work_done(folder: Path, squeue: dict[int, dict[str, Any]], work_s: float) -> tuple[list[float], float]:
    """Each job's work done by the pass's end (its checkpoint, or where its run stands for one
    still running or suspended then, as the oracle counts work in progress), and the work run
    in all, kept or not."""
    saved: dict[int, float] = {}
    last: dict[int, tuple[int, float]] = {}  # job -> (its latest run, where that run's work stands)
    ran = 0.0
    for path in folder.glob("work-*"):
        job, _, run = path.name.removeprefix("work-").partition(".ran-")
        try:
            if run:
                this, stands = map(float, path.read_text().split())
                ran += this
                if int(run) >= last.get(int(job), (-1, 0.0))[0]:
                    last[int(job)] = (int(run), stands)
            elif not path.name.endswith(".tmp"):
                saved[int(job)] = float(path.read_text())
        except ValueError:
            continue
    kept = []
    for number in saved.keys() | last.keys():
        done = saved.get(number, 0.0)
        if squeue.get(number, {}).get("job_state") in ("RUNNING", "SUSPENDED") and number in last:
            done = max(done, last[number][1])
        kept.append(min(done, work_s))
    return kept, ran


def job_where(job: dict[str, Any]) -> tuple[str, str]:
    """A job's state (a pending one's with Slurm's reason) and its node, from squeue."""
    state = str(job["job_state"])
    if state == "PENDING":
        state = f"pending ({job.get('state_reason') or '?'})"
    return state, str(job.get("nodes") or "")


def idle_slots(
    trace: list[tuple[float, dict[int, tuple[str, str]]]],
    schedule: dict[str, list[tuple[float, float]]],
    seconds: float,
    slots: int,
    queue: int,
) -> dict[str, float]:
    """Slot-seconds in which the oracle works and the fleet does not, by where the fleet's jobs
    were meanwhile (from squeue, as the pass saw it every top-up): suspended on a protected
    node, pending (waiting to be placed, or requeued), running on a protected node (its grace,
    or before the node saw its program), starting or ending (CONFIGURING, COMPLETING), or not
    in the fleet at all (ended, not yet followed by a new one)."""
    out: dict[str, float] = {}
    for (t, states), (t_next, _) in itertools.pairwise([*trace, (seconds, {})]):
        mid = t
        busy = {n for n, spans in schedule.items() if any(a <= mid < b for a, b in spans)}
        want = min(queue, slots * (len(schedule) - len(busy)))
        useful, why = 0, []
        for state, nodes in states.values():
            if state == "RUNNING" and nodes and nodes not in busy:
                useful += 1
            elif state == "RUNNING":
                why.append("running on a protected node")
            elif state in ENDED:
                continue
            else:
                why.append(state.lower())
        gap = max(0, want - useful)
        why += ["not in the fleet"] * max(0, queue - useful - len(why))
        for reason in why[:gap]:
            out[reason] = out.get(reason, 0.0) + (t_next - t)
    return out


def worker_processes(marker: str) -> list[tuple[int, str, str, str]]:
    """(pid, node, Slurm job, state) of every throughput job process running now."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as fh:
                if marker.encode() not in fh.read():
                    continue
            with open(f"/proc/{entry.name}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                env = dict(i.split(b"=", 1) for i in fh.read().split(b"\0") if b"=" in i)
        except (OSError, IndexError):
            continue
        node = env.get(b"SLURMD_NODENAME", b"").decode()
        out.append((int(entry.name), node, env.get(b"SLURM_JOB_ID", b"").decode(), state))
    return out


def throughput(
    cluster: SlurmCluster,
    names: list[str],
    args: argparse.Namespace,
    schedule: dict[str, list[tuple[float, float]]],
    tag: str,
    grace_s: float = 0.0,
    checkpoint: bool = True,
) -> Pass:
    """One pass in ``args.throughput_s``.  Every ``SAMPLE_S`` it looks at the job processes on
    the nodes whose protected program runs: one not stopped is within its grace when its job
    was stopped (evicted) at most ``grace_s`` (and a second of slack) before (or the timeline
    says so at most ``STOP_SAID_S`` after), reacting in the first ``REACT_S`` of the protected
    program, else outside.  The work done counts, as the oracle's does, the work of jobs still
    running or suspended when the pass ends (their checkpoint would keep it)."""
    folder = cluster.root / f"throughput-{tag}"
    folder.mkdir()
    (folder / "work.py").write_text(WORK)
    script = (SIGNAL_LINE if checkpoint else "") + (
        f"exec {sys.executable} {folder / 'work.py'} {folder}/work-$SLURM_JOB_ID {args.work_s}\n"
    )
    options = ("--requeue", "--constraint=arbiter-admit", f"--cpus-per-task={4 // args.slots}")
    jobs = [cluster.sbatch(script, *options, "--hold") for _ in range(args.queue)]
    events = sorted(
        (t, name, on) for name, spans in schedule.items() for span in spans for t, on in zip(span, (1, 0), strict=True)
    )
    games: dict[str, subprocess.Popen[bytes]] = {}
    since: dict[str, float] = {}  # wall time each running protected program started
    # (time in the pass, node, Slurm job, seconds since the look before) of a process running while protected
    seen: list[tuple[float, str, str, float]] = []
    trace: list[tuple[float, dict[int, tuple[str, str]]]] = []  # (time in the pass, each job's state and node)
    start_wall = time.time()
    samples = 0
    try:
        cluster.run("scontrol", "release", ",".join(map(str, jobs)))
        start, start_wall = time.perf_counter(), time.time()
        topped_up = sampled = 0.0
        while (now := time.perf_counter() - start) < args.throughput_s:
            while events and events[0][0] <= now:
                _, name, on = events.pop(0)
                if on:
                    games[name] = subprocess.Popen(own_sleep(985000 + names.index(name)).split())
                    since[name] = time.time()
                else:
                    game = games.pop(name)
                    game.kill()
                    game.wait()
                    since.pop(name, None)
            if since and now - sampled >= SAMPLE_S:
                gap, sampled = min(now - sampled, MAX_GAP_S), now
                samples += 1
                wall = time.time()
                for _pid, node, job, state in worker_processes(str(folder / "work.py")):
                    if node in since and state not in ("T", "t", "Z"):
                        seen.append((wall - start_wall, node, job, gap))
            if now - topped_up >= TOP_UP_S:  # a job that ended is followed by a new one
                topped_up = now
                squeue = cluster.jobs()
                trace.append((now, {j: job_where(squeue[j]) for j in jobs if j in squeue}))
                live = sum(1 for j in jobs if squeue.get(j, {}).get("job_state") not in ENDED)
                jobs += [j for _ in range(args.queue - live) if (j := submit(cluster, script, options)) is not None]
            time.sleep(0.02)
        squeue = cluster.jobs()  # the pass's end: a job still running there has done its work so far
        kept, ran = work_done(folder, squeue, args.work_s)
        requeued = sum(squeue[j]["restart_cnt"] for j in jobs if j in squeue)
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
    result = Pass(sum(kept), ran, sum(1 for d in kept if d >= args.work_s), requeued, samples)
    result.idle = idle_slots(trace, schedule, args.throughput_s, args.slots, args.queue)
    stops = {name: stopped_at(cluster.arbiter[name], start_wall) for name in names}
    last_after: dict[tuple[str, str, float], float] = {}
    result.beside_s = sum(gap for *_, gap in seen)
    for at, node, job, _ in seen:
        stop = max((t for t, subject in stops[node] if subject == job and t <= at + STOP_SAID_S), default=None)
        if stop is not None and at - stop <= grace_s + 1.0:
            result.in_grace += 1
            last_after[(node, job, stop)] = max(last_after.get((node, job, stop), 0.0), at - stop)
        elif any(on <= at < on + REACT_S for on, _ in schedule.get(node, [])):
            result.reacting += 1
        else:
            result.outside.append(f"job {job} on {node} {at:.1f} s into the pass")
    result.evicted_ran_s = sorted(last_after.values())
    return result


def stopped_at(node: Any, start_wall: float) -> list[tuple[float, str]]:
    """(time in the pass, Slurm job) of each job the node's daemon stopped."""
    events = node.call("timeline", code="JOB_STOPPED", limit=1000)["events"]
    return [(e["t"] - start_wall, str(e["subject"]).removeprefix("slurm-").split(".")[0]) for e in events]
