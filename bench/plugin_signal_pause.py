"""Fast-path cost of pausing a job: the signal translator stopping a 5-process tree.

    uv run python bench/plugin_signal_pause.py [--processes 5] [--rounds 1000]

Times ``SignalTranslator.pause`` (start-time check and SIGSTOP per process) over a real
tree, resuming between rounds, and prints p50/p99 in microseconds.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from arbiter.plugin import JobTarget, PluginContext, ProcessRef
from arbiter_translators import SignalTranslator

_TREE = """
import subprocess, sys, time
kids = [subprocess.Popen(["sleep", "600"]) for _ in range(int(sys.argv[1]))]
print(" ".join(str(k.pid) for k in kids), flush=True)
time.sleep(600)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1000)
    args = parser.parse_args()
    root = subprocess.Popen([sys.executable, "-c", _TREE, str(args.processes - 1)], stdout=subprocess.PIPE, text=True)
    assert root.stdout is not None
    pids = [root.pid, *(int(p) for p in root.stdout.readline().split())]
    refs = tuple(ProcessRef(pid, psutil.Process(pid).create_time()) for pid in pids)
    target = JobTarget(job_id="bench", name="bench", processes=refs)
    translator = SignalTranslator(SignalTranslator.Options(), PluginContext(state_dir=Path(tempfile.gettempdir())))
    samples = []
    try:
        for _ in range(args.rounds):
            started = time.perf_counter_ns()
            paused = translator.pause(target)
            samples.append((time.perf_counter_ns() - started) / 1000)
            assert len(paused) == len(refs)
            translator.resume(refs)
    finally:
        translator.resume(refs)
        translator.kill(target)
        root.wait()
    samples.sort()
    p50, p99 = samples[len(samples) // 2], samples[int(len(samples) * 0.99)]
    print(f"pause of a {len(refs)}-process tree over {args.rounds} rounds: p50 {p50:.0f} µs, p99 {p99:.0f} µs")


if __name__ == "__main__":
    main()
