"""What an idle daemon's CPU and wake-ups go to, thread by thread: a profile of one idle minute.

    uv run python bench/idle_profile.py [--seconds 60] [--top 6]

The daemon of ``bench/cost.py``'s idle node (the shipped rule files, one protected program
with a JSONL phase source, no job, about three hundred processes on the host, the default
tick) runs in this process, with a profile hook on every thread it starts.  After it has
settled, one window: for each of its threads (and each thread of its child processes) the
CPU it used and how often it woke (``/proc/self/task/TID/schedstat``: run time and the
number of times it was put on a CPU), and for the daemon's own threads the Python functions
they called most.  The hook slows the calls it counts, so the CPU figures here run above
``bench/cost.py``'s; the shares and the wake-ups are what this tells.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import cost  # noqa: E402  (beside this file)


class CallCounts:
    """Python calls by thread name and function, while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.by_thread: dict[str, Counter[str]] = {}

    def hook(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call" and self.on:
            name = threading.current_thread().name
            code = frame.f_code
            where = f"{Path(code.co_filename).name}:{code.co_qualname}"
            self.by_thread.setdefault(name, Counter())[where] += 1


def schedstat(pid: int) -> dict[int, tuple[int, int]]:
    """Each thread of ``pid``: (ns on a CPU, times put on one)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                run_ns, _, slices = fh.read().split()
        except (OSError, ValueError):
            continue
        out[int(tid)] = (int(run_ns), int(slices))
    return out


def children(pid: int) -> list[int]:
    out: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out.extend(int(c) for c in fh.read().split())
        except OSError:
            continue
    return out


def snapshot() -> dict[str, tuple[int, int]]:
    """(CPU ns, wake-ups) of every thread of this process and of its children, by a name
    that says which thread it is."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {f"daemon/{names.get(tid, tid)}": v for tid, v in schedstat(os.getpid()).items()}
    for child in children(os.getpid()):
        label = cost.process_name(child)
        if label.startswith("sleep") or cost.PROTECTED_MARKER in label:
            continue
        for tid, v in schedstat(child).items():
            out[f"{label}/{'main' if tid == child else tid}"] = v
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--top", type=int, default=6)
    args = parser.parse_args(argv)

    from arbiter.config.loader import load_node_config
    from arbiter.daemon.core import Daemon
    from arbiter_testing.node import HarnessNode
    from arbiter_testing.rules import phase_rule

    root = Path(tempfile.mkdtemp(prefix="arbiter-idle-profile-"))
    sleepers = cost.top_up(cost.IDLE_PROCESSES)
    counts = CallCounts()
    threading.setprofile(counts.hook)  # every thread the daemon starts from here on
    daemon = None
    protected = None
    try:
        phases = root / "phases.jsonl"
        phases.touch()
        node = HarnessNode(root, tick_s=2.0)
        for rule in sorted(cost.SHIPPED_RULES.glob("*.yaml")):
            shutil.copy(rule, node.tenants / rule.name)
            os.chmod(node.tenants / rule.name, 0o644)
        node.add_rule("protected", phase_rule("protected", cost.PROTECTED_MARKER, phases, scope="all", priority=90))
        config, _ = load_node_config(node.config_path)
        protected = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(86400)", cost.PROTECTED_MARKER])
        daemon = Daemon(config, node.config_path)
        daemon.start()
        time.sleep(cost.SETTLE_S)
        before, cpu0 = snapshot(), time.process_time()
        counts.on = True
        time.sleep(args.seconds)
        counts.on = False
        after, cpu1 = snapshot(), time.process_time()
        rows = []
        for key, (ns, slices) in after.items():
            ns0, slices0 = before.get(key, (0, 0))
            rows.append((key, (ns - ns0) / 1e6 / args.seconds * 60, (slices - slices0) / args.seconds))
        rows.sort(key=lambda r: -r[1])
        print(
            f"one idle window of {args.seconds:g}s: this process {1000 * (cpu1 - cpu0) / args.seconds * 60:.0f} ms/min"
        )
        for key, ms_min, wakes in rows:
            if ms_min < 1 and wakes < 0.05:
                continue
            print(f"  {key:48s} {ms_min:7.1f} ms/min  {wakes:5.2f} wake-ups/s")
            thread = key.partition("/")[2]
            if key.startswith("daemon/") and thread in counts.by_thread:
                for where, n in counts.by_thread[thread].most_common(args.top):
                    print(f"      {n / args.seconds:8.1f} calls/s  {where}")
    finally:
        threading.setprofile(None)
        if daemon is not None:
            daemon.shutdown()
        for proc in [*sleepers, *([protected] if protected else [])]:
            proc.kill()
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
