"""The budget governor against an oracle: slowdown of the protected program and the job's
throughput as a share of the best constant duty's.

    uv run python bench/governor.py [--window 6] [--period 5] [--periods 12] [--free]
    uv run python bench/governor.py --model [--seed 7]

A protected stand-in works in frames that leave part of one core idle (paced as a game paces
them, or free-running with ``--free``); the reference job
(examples/llmbatch, the stand-in backend) runs on the same core.  The bench first sweeps
constant duties (the job's control document written by hand, no daemon) to find the oracle:
the highest constant duty whose slowdown stays within the 5 % target.  Then it runs a real
daemon under ``gpu_jobs: certified`` with a certificate ceiling of 0.5 and the governor's
period shortened to ``--period``, lets it settle, and measures over ``--periods`` periods:
the protected program's slowdown against its own baseline, and the job's throughput as a
share of the oracle's.  Goal: slowdown within the target, throughput at least 85 % of the
oracle's.

``--model`` runs the governor's own decision function (arbiter.engine.governor.step) with a fake
clock against three slowdown curves instead of processes, so the search itself is measured
without the box's noise: ``paced`` (no slowdown until the duty fills the frames' slack, then
linear: a game's paced frames), ``free`` (proportional to the duty: a free-running program) and
``convex`` (quadratic in the duty).  Each period the program's rate is read with 0.5 % noise;
halfway through, its load steps up (every slowdown × 1.6).  Per curve: the oracle (the highest
duty whose slowdown is within the target), the governor's steady duty and slowdown over the
last quarter of each half, its job throughput as a share of the oracle's (throughput grows
with the duty), and how many periods after the load step the pressure is back under the target.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from arbiter.engine import governor
from arbiter.engine.types import GovernorPolicy, GovernorState, SourceObs
from arbiter.sdk.control import ignore_nudges, write_control_document
from arbiter_testing.certified import CORE, certify, llmbatch_cmd, stand_in_cmd, stand_in_rule
from arbiter_testing.node import HarnessNode

ROOT = Path(__file__).resolve().parents[1]
JOB_DIR = ROOT / "examples" / "llmbatch"
TARGET = 0.05
CEILING = 0.5


#: the protected stand-in's frames: 5 ms of CPU work in each 10 ms slot (paced, as a game's),
#: or with ``--free`` 4 ms of work then 6 ms idle, free-running
PACED = ["--step-s", "0.005", "--frame-s", "0.010"]
FREE = ["--step-s", "0.004", "--gap-s", "0.006"]


def off_core(pid: int) -> None:
    """Keep the daemon's threads off the contended core: on a GPU host the daemon spends CPU,
    not GPU time, so here its ticks must not count as interference the governor answers."""
    others = set(os.sched_getaffinity(0)) - {CORE} if hasattr(os, "sched_setaffinity") else set()
    if not others:
        return  # one core: nowhere else to put it
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), others)
        except OSError:
            pass  # a thread that just ended


def count(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(1 for _ in fh)
    except FileNotFoundError:
        return 0


def rates(events: Path, out: Path, seconds: float) -> tuple[float, float]:
    """(protected frames/s, job prompts/s) over the next ``seconds``."""
    e0, o0, t0 = count(events), count(out), time.monotonic()
    time.sleep(seconds)
    dt = time.monotonic() - t0
    return (count(events) - e0) / dt, (count(out) - o0) / dt


def sweep(window: float, frames: list[str], tmp: Path) -> tuple[float, list[tuple[float, float, float]]]:
    """Baseline frames/s and, per constant duty, (duty, slowdown, job prompts/s)."""
    events, out, control = tmp / "sweep-events.jsonl", tmp / "sweep-out.jsonl", tmp / "control.json"
    protected = subprocess.Popen(stand_in_cmd(events, *frames))
    rows = []
    try:
        time.sleep(1.0)
        base, _ = rates(events, out, window)
        write_control_document(str(control), "run", 0.05, 1)
        env = {**os.environ, "ARBITER_CONTROL": str(control)}
        ignore_nudges()  # inherited: a nudge before the job installs its handler must not end it
        job = subprocess.Popen(llmbatch_cmd(out), cwd=JOB_DIR, env=env, stderr=subprocess.DEVNULL)
        try:
            for seq, duty in enumerate([0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5], start=2):
                write_control_document(str(control), "run", duty, seq)
                job.send_signal(10)  # SIGUSR1: the nudge
                time.sleep(1.0)
                fps, prompts = rates(events, out, window)
                rows.append((duty, 1 - fps / base, prompts))
                print(
                    f"  constant duty {duty:.2f}: slowdown {100 * (1 - fps / base):5.1f}%  job {prompts:6.2f} prompts/s"
                )
        finally:
            job.kill()
            job.wait()
    finally:
        protected.kill()
        protected.wait()
    return base, rows


def governed(window_periods: int, period: float, frames: list[str], tmp: Path) -> tuple[float, float, float, list[str]]:
    """(baseline frames/s, steady frames/s, job prompts/s, summaries) under a real daemon."""
    root = tmp / "node"
    events, out = root / "events.jsonl", root / "out.jsonl"
    manifest = root / "llmbatch.yaml"
    node = HarnessNode(
        root,
        gpu_jobs="certified",
        tick_s=0.5,
        gpu_release_after_s=10,
        governor={
            "period_s": period,
            "baseline_s": period,
            "rebaseline_s": 3600,
            "take_back_s": 2 * period,
            "grow_step": 0.05,
        },
    )
    manifest.write_text("name: llmbatch\ncapabilities: [cooperative_throttle, cooperative_pause]\n")
    summaries: list[str] = []
    try:
        node.add_rule("frames", stand_in_rule(events, max_slowdown=TARGET))
        node.start()
        off_core(node.daemon.pid)  # type: ignore[union-attr]
        protected = node.spawn(stand_in_cmd(events, *frames))
        node.wait_for(lambda: node.status()["rules"][0]["running"])
        base, _ = rates(events, out, 2 * period)
        certify(node, protected.pid, "frames", CEILING, run_id="bench")
        node.job_run(llmbatch_cmd(out), "--manifest", str(manifest), cwd=JOB_DIR, stderr=subprocess.DEVNULL)
        node.wait_for(lambda: (r := node.call("duty")["duty"]["rules"]) and r[0]["state"] == "running", timeout=60)
        time.sleep(3 * period)  # let it settle
        e0, o0, t0 = count(events), count(out), time.monotonic()
        for _ in range(window_periods):
            time.sleep(period)
            summaries.append(node.call("duty")["duty"]["summary"])
        dt = time.monotonic() - t0
        timeline = [e for e in node.call("timeline", limit=1000)["events"] if e["code"].startswith("GPU_DUTY")]
        for e in sorted(timeline, key=lambda e: e["t"]):
            summaries.append(f"{e['code']}: {e['message']}")
        return base, (count(events) - e0) / dt, (count(out) - o0) / dt, summaries
    finally:
        node.close()


#: the model's slowdown curves: duty → slowdown, at the load before the step
CURVES: dict[str, Callable[[float], float]] = {
    "paced": lambda d: max(0.0, 0.25 * (d - 0.2)),
    "free": lambda d: 0.15 * d,
    "convex": lambda d: 0.4 * d * d,
}
MODEL_CEILING = 0.8
LOAD_STEP = 1.6
NOISE = 0.005


def oracle_duty(curve: Callable[[float], float], load: float = 1.0) -> float:
    """The highest duty (to 0.001, up to the ceiling) whose slowdown is within the target."""
    return max(d / 1000 for d in range(int(MODEL_CEILING * 1000) + 1) if load * curve(d / 1000) <= TARGET)


def model(curve: Callable[[float], float], periods: int, rng: random.Random) -> dict[str, Any]:
    """The engine's governor, one decision a period, against ``curve``; the load steps up halfway."""
    gp = GovernorPolicy(period_s=1.0, baseline_s=1.0, rebaseline_s=1e9, take_back_s=2.0, grow_step=0.05)
    gs = GovernorState()
    base = 100.0
    duties: list[float] = []
    slowdowns: list[float] = []
    pressures: list[float | None] = []
    budget = 0.0
    for t in range(2 * periods):
        load = 1.0 if t < periods else LOAD_STEP
        slowdown = load * curve(budget)
        rate = base * (1 - slowdown) * (1 + rng.gauss(0, NOISE))
        progress = SourceObs(readable=True, rate=rate)
        gs = governor.step("model", gs, progress, MODEL_CEILING, TARGET, None, gp, float(t)).state
        duties.append(budget)
        slowdowns.append(slowdown)
        pressures.append(gs.pressure if gs.decided_at == float(t) else None)
        budget = gs.budget if gs.mode == "running" else 0.0
    # the first period after the step whose pressure, as the governor reads it, is under the target
    after = [t - periods for t in range(periods + 1, 2 * periods) if (pressures[t] or 0.0) < TARGET]
    recovered = after[0] if after else None

    def steady(lo: int, hi: int) -> tuple[float, float]:
        return sum(duties[lo:hi]) / (hi - lo), sum(slowdowns[lo:hi]) / (hi - lo)

    quarter = periods // 4
    return {
        "before": steady(periods - quarter, periods),
        "after": steady(2 * periods - quarter, 2 * periods),
        "recovered_in": recovered,
    }


def run_model(periods: int, seed: int, replicates: int) -> int:
    rng = random.Random(seed)
    print(
        f"model: target {100 * TARGET:.0f}%, ceiling {MODEL_CEILING}, {periods} periods at each load"
        f" (× {LOAD_STEP} halfway), rate noise {100 * NOISE:.1f}% (the baseline's reading too),"
        f" {replicates} runs per stand-in: means over them"
    )
    print(
        f"{'stand-in':>8} {'load':>5} {'oracle':>7} {'steady duty':>11} {'slowdown':>9} {'throughput':>10}"
        f" {'worst':>6}  periods back under the target after the step (worst run)"
    )
    worst_share, worst_slowdown, worst_back = 1.0, 0.0, 0
    for name, curve in CURVES.items():
        runs = [model(curve, periods, rng) for _ in range(replicates)]
        for label, load in (("before", 1.0), ("after", LOAD_STEP)):
            oracle = oracle_duty(curve, load)
            duty = sum(r[label][0] for r in runs) / replicates
            slowdown = sum(r[label][1] for r in runs) / replicates
            share = duty / oracle
            low = min(r[label][0] for r in runs) / oracle
            worst_share, worst_slowdown = min(worst_share, share), max(worst_slowdown, slowdown)
            back = ""
            if label == "after":
                periods_back = [r["recovered_in"] for r in runs]
                slowest = None if None in periods_back else max(p for p in periods_back if p is not None)
                worst_back = max(worst_back, slowest if slowest is not None else periods)
                back = f"  {slowest if slowest is not None else 'never'}"
            print(
                f"{name:>8} {load:>5.1f} {oracle:>7.3f} {duty:>11.3f} {100 * slowdown:>8.2f}%"
                f" {100 * share:>9.1f}% {100 * low:>5.0f}%{back}"
            )
    print(
        f"lowest mean throughput share {100 * worst_share:.1f}% (goal ≥ 85%), highest mean steady slowdown"
        f" {100 * worst_slowdown:.2f}% (goal ≤ {100 * TARGET:.0f}%), slowest return under the target"
        f" {worst_back} period(s) (goal ≤ 2)"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=float, default=6.0, help="seconds measured per constant duty")
    parser.add_argument("--period", type=float, default=5.0, help="the governor's period_s (and baseline_s)")
    parser.add_argument("--periods", type=int, default=12, help="periods measured under the governor (at least 10)")
    parser.add_argument(
        "--free",
        action="store_true",
        help="a free-running stand-in (4 ms of work, 6 ms idle) instead of paced frames: every "
        "frame then slows with the job's duty",
    )
    parser.add_argument("--model", action="store_true", help="the decision function against model curves (seconds)")
    parser.add_argument("--seed", type=int, default=7, help="--model: the noise's seed")
    parser.add_argument("--model-periods", type=int, default=80, help="--model: periods at each load")
    parser.add_argument("--model-runs", type=int, default=40, help="--model: runs per stand-in")
    args = parser.parse_args()
    if args.model:
        return run_model(args.model_periods, args.seed, args.model_runs)
    frames = FREE if args.free else PACED
    with tempfile.TemporaryDirectory(prefix="arbiter-governor-") as tmp:
        print(f"sweeping constant duties (protected and job on CPU {CORE}):")
        base, rows = sweep(args.window, frames, Path(tmp))
        within = [r for r in rows if r[1] <= TARGET]
        oracle = max(within, key=lambda r: r[0]) if within else (0.0, 0.0, 0.0)
        print(
            f"oracle: duty {oracle[0]:.2f} (slowdown {100 * oracle[1]:.1f}%, job {oracle[2]:.2f} prompts/s); "
            f"protected alone {base:.1f} frames/s"
        )
        print(f"governor: period {args.period:g}s, ceiling {CEILING}, target {100 * TARGET:.0f}%:")
        gbase, steady, prompts, summaries = governed(max(10, args.periods), args.period, frames, Path(tmp))
        for line in summaries:
            print(f"  {line}")
        slowdown = 1 - steady / gbase
        share = prompts / oracle[2] if oracle[2] else float("nan")
        print(
            json.dumps(
                {
                    "oracle_duty": oracle[0],
                    "oracle_prompts_per_s": round(oracle[2], 3),
                    "steady_slowdown": round(slowdown, 4),
                    "job_prompts_per_s": round(prompts, 3),
                    "throughput_share_of_oracle": round(share, 3),
                }
            )
        )
        print(
            f"steady-state slowdown {100 * slowdown:.1f}% (target {100 * TARGET:.0f}%), "
            f"job throughput {100 * share:.0f}% of the oracle's (goal ≥ 85%)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
