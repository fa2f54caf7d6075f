"""The daemon's cost per tick with 300 processes and 10 rules, and the demo's wall time.

    uv run python bench/tick_cost.py [--seconds 20] [--no-demo]

Starts 300 idle processes and a daemon with 10 rules (one matching 30 of them) and two jobs,
lets it tick every 0.25 s, and prints the CPU time the tick thread and the decision thread
spend per tick (the daemon's process CPU clock around each, as the plugin calls run on pool
threads) beside the whole daemon process's CPU time per tick (which adds the idle HTTP and
socket threads).  Each sleeper is a shell and its sleep: two processes.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from arbiter_testing.node import PYTHON, HarnessNode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--processes", type=int, default=300)
    parser.add_argument("--no-demo", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="arbiter-bench-"))
    # `sh -c 'sleep 600; :' NAME`: the shell stays (it cannot exec the last command) with NAME in its cmdline
    sleepers = [
        subprocess.Popen(["sh", "-c", "sleep 600; :", f"bench-group-{i % 10}"], start_new_session=True)
        for i in range(args.processes // 2)
    ]
    node = HarnessNode(root, tick_s=0.25, http={"listen": "127.0.0.1:0"})
    try:
        for i in range(10):
            node.add_rule(
                f"r{i}",
                {
                    "id": f"r{i}",
                    "priority": 10 * i,
                    "match": {"cmdline": [f"bench-group-{i}"]},
                    **({"protect": {"metric": "gpu_share"}} if i % 2 else {}),
                },
            )
        node.start()
        for name in ("a", "b"):
            node.job_run(
                [PYTHON, "-c", "import time; time.sleep(600)"], "--name", f"bench-{name}", stderr=subprocess.DEVNULL
            )
        node.wait_for(lambda: len(node.status()["jobs"]) == 2)
        daemon = psutil.Process(node.daemon.pid)  # type: ignore[union-attr]
        before, cpu0, t0 = node.status()["costs"], daemon.cpu_times(), time.monotonic()
        time.sleep(args.seconds)
        after, cpu1, t1 = node.status(), daemon.cpu_times(), time.monotonic()
        costs = after["costs"]
        ticks = costs["ticks"] - before["ticks"]
        proc_cpu = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
        print(f"processes on the host: {after['processes']}, rules: {len(after['rules'])}, jobs: {len(after['jobs'])}")
        print(f"ticks: {ticks} in {t1 - t0:.1f}s")
        print(f"tick CPU (scan, match, read) per tick, mean since start: {costs['tick_cpu_ms']} ms")
        print(f"decision CPU per decision, mean since start: {costs['decide_cpu_ms']} ms")
        print(
            f"whole daemon process CPU per tick: {1000 * proc_cpu / max(ticks, 1):.2f} ms "
            f"({100 * proc_cpu / (t1 - t0):.1f}% of one core)"
        )
        print(f"last scan wall time: {after['scan_ms']} ms; daemon RSS: {daemon.memory_info().rss / 2**20:.0f} MiB")
    finally:
        node.close()
        for s in sleepers:
            os.killpg(s.pid, signal.SIGKILL)  # the shell and its sleep
        for s in sleepers:
            s.wait()
    if not args.no_demo:
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "arbiter", "demo"], capture_output=True, text=True, check=False)
        print(f"demo wall time: {time.monotonic() - started:.1f}s (exit {result.returncode})")


if __name__ == "__main__":
    main()
