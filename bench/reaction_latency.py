"""From a phase written to a watched file to the job's process seen stopped.

    uv run python bench/reaction_latency.py [--changes 40]

A protected program (``sleep``) runs under an ``immediate`` rule whose phase is read from a
JSONL file; a plain job runs under ``arbiter job run``; a busy loop keeps the other core
loaded.  The bench appends phase lines at random intervals and polls the job's state until
it is stopped (or continued), then prints p50/p99 beside the figure ``status`` shows for the
source (write seen → decided and signalled), and the same for a rule that is not immediate
(the tick).  The immediate rule is measured twice: with the reflex process acting on the
change, and with it off (``reflex_process: false``), the decision thread acting.  Then
``--exits`` times, a protected program (a rule with ``pause_fleet``) starts, runs a couple of
ticks and is killed: the time until the job it held is seen running again.

Then the fast path against its floor, in ``--rounds`` interleaved rounds: in each, ``--changes``
phase lines to the daemon's immediate rule (the reflex process acting) and as many to a bare
watcher (bench/bare_watcher.py: inotify on another file, then SIGSTOP/SIGCONT to a process
like the job), which goes first alternating round by round, so what the box does meanwhile
falls on both.  Printed per round and as the median over rounds: each side's p50 and p99, and
their ratio (goal: at most 1.5 for both).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from arbiter_testing.node import PYTHON, HarnessNode
from arbiter_testing.reaction import ms_until_seen, phase_reactions
from arbiter_testing.reaction import percentile as pct
from arbiter_testing.rules import phase_rule


def measure(immediate: bool, changes: int, tick_s: float, **config: Any) -> tuple[list[float], dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="arbiter-reaction-") as folder:
        return _measure(Path(folder), immediate, changes, tick_s, **config)


def _measure(
    root: Path, immediate: bool, changes: int, tick_s: float, **config: Any
) -> tuple[list[float], dict[str, Any]]:
    events = root / "events.jsonl"
    events.touch()
    node = HarnessNode(root, tick_s=tick_s, **config)
    try:
        node.add_rule("p", phase_rule("p", "sleep 999", events, scope="all", immediate=immediate))
        node.start()
        node.spawn(["sleep", "999"])
        node.job_run(
            [PYTHON, "-c", "import time\nwhile True: time.sleep(0.001)"], "--name", "plain", stderr=subprocess.DEVNULL
        )
        pid = node.job_pid("plain")
        node.wait_for(lambda: node.status()["rules"][0]["running"])
        latencies = phase_reactions(events, pid, changes, random.Random())
        return latencies, node.status()["rules"][0]["sources"][0]["latency"]
    finally:
        node.close()


LOOP = "import time\nwhile True: time.sleep(0.001)"


def exit_reactions(changes: int, tick_s: float) -> list[float]:
    """ms from a protected program's end until the job it held is seen running again, its
    program started anew and ended ``changes`` times (each run a few seconds: long enough to
    be seen on a tick and watched for its end)."""
    with tempfile.TemporaryDirectory(prefix="arbiter-reaction-") as folder:
        node = HarnessNode(Path(folder), tick_s=tick_s)
        marker = f"sleep 1103.{os.getpid()}"
        try:
            node.add_rule("game", {"id": "game", "match": {"cmdline": [marker]}, "pause_fleet": {"scope": "all"}})
            node.start()
            node.job_run([PYTHON, "-c", LOOP], "--name", "plain", stderr=subprocess.DEVNULL)
            proc = psutil.Process(node.job_pid("plain"))
            out = []
            for _ in range(changes):
                program = node.spawn(marker.split())
                node.wait_for(lambda: proc.status() == psutil.STATUS_STOPPED, every=0.01)
                time.sleep(2 * tick_s)  # it runs on: seen on more than one tick
                started = time.monotonic()
                program.kill()
                out.append(ms_until_seen(proc, False, started))
                program.wait()
            return out
        finally:
            node.close()


def against_bare(rounds: int, changes: int, tick_s: float) -> list[tuple[list[float], list[float]]]:
    """Per round, (the daemon's fast path, the bare watcher): ms from a phase line to the
    process seen stopped or running again, the two sides interleaved."""
    with tempfile.TemporaryDirectory(prefix="arbiter-reaction-") as folder:
        root = Path(folder)
        events, bare_events = root / "events.jsonl", root / "bare.jsonl"
        events.touch()
        bare_events.touch()
        node = HarnessNode(root / "node", tick_s=tick_s)
        target = subprocess.Popen([PYTHON, "-c", LOOP])
        watcher = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("bare_watcher.py")), str(bare_events), str(target.pid)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert watcher.stdout is not None and watcher.stdout.readline().strip() == "ready"
            node.add_rule("p", phase_rule("p", "sleep 999", events, scope="all", immediate=True))
            node.start()
            node.spawn(["sleep", "999"])
            node.job_run([PYTHON, "-c", LOOP], "--name", "plain", stderr=subprocess.DEVNULL)
            pid = node.job_pid("plain")
            node.wait_for(lambda: node.status()["rules"][0]["running"])
            rng = random.Random(1)
            out = []
            for n in range(rounds):
                sides = [(events, pid), (bare_events, target.pid)]
                if n % 2:
                    sides.reverse()
                got = {path: phase_reactions(path, p, changes, rng) for path, p in sides}
                out.append((got[events], got[bare_events]))
            return out
        finally:
            node.close()
            for proc in (watcher, target):
                proc.kill()
                proc.wait()


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--changes", type=int, default=40)
    parser.add_argument("--tick", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds against the bare watcher")
    parser.add_argument("--exits", type=int, default=10, help="times a protected program ends, the job it held timed")
    args = parser.parse_args()
    load = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # the other core is busy
    try:
        watch, daemon = measure(True, args.changes, args.tick)
        inside, inside_daemon = measure(True, args.changes, args.tick, reflex_process=False)
        tick, _ = measure(False, max(6, args.changes // 5), args.tick)
        ended = exit_reactions(args.exits, args.tick) if args.exits > 0 else []
        rounds = against_bare(args.rounds, args.changes, args.tick) if args.rounds > 0 else []
    finally:
        load.kill()
        load.wait()
    print(
        f"immediate rule, write -> job stopped/continued: p50 {pct(watch, 0.5):.2f} ms, p99 {pct(watch, 0.99):.2f} ms"
        f" over {len(watch)} changes"
    )
    print(
        f"  the source's figure in status (write seen -> decided and signalled): p50 {daemon['p50_ms']} ms,"
        f" p99 {daemon['p99_ms']} ms over {daemon['count']} changes"
    )
    print(
        f"the same, the reflex process off (the decision thread acts): p50 {pct(inside, 0.5):.2f} ms,"
        f" p99 {pct(inside, 0.99):.2f} ms over {len(inside)} changes; status says p50 {inside_daemon['p50_ms']} ms,"
        f" p99 {inside_daemon['p99_ms']} ms"
    )
    print(f"rule without immediate (tick {args.tick:g}s): p50 {pct(tick, 0.5):.0f} ms, p99 {pct(tick, 0.99):.0f} ms")
    if ended:
        print(
            f"a protected program's end -> the job it held running again (tick {args.tick:g}s):"
            f" p50 {pct(ended, 0.5):.1f} ms, p99 {pct(ended, 0.99):.1f} ms over {len(ended)} ends"
        )
    if not rounds:
        return
    print(f"fast path against a bare inotify + SIGSTOP watcher, {len(rounds)} interleaved rounds of {args.changes}:")
    ratios: dict[float, list[float]] = {0.5: [], 0.99: []}
    for n, (fast, bare) in enumerate(rounds, 1):
        line = []
        for p in (0.5, 0.99):
            ratios[p].append(pct(fast, p) / pct(bare, p))
            line.append(f"p{p * 100:g} {pct(fast, p):.2f} / {pct(bare, p):.2f} ms (x{ratios[p][-1]:.2f})")
        print(f"  round {n}: " + ", ".join(line))
    for p in (0.5, 0.99):
        verdict = "ok" if median(ratios[p]) <= 1.5 else "above the goal"
        print(f"  median over rounds, p{p * 100:g}: x{median(ratios[p]):.2f} ({verdict}; goal at most x1.5)")


if __name__ == "__main__":
    main()
