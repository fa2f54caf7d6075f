"""From a phase written to a watched file to the job's process seen stopped.

    uv run python bench/reaction_latency.py [--changes 40]

A protected program (``sleep``) runs under an ``immediate`` rule whose phase is read from a
JSONL file; a plain job runs under ``arbiter job run``; a busy loop keeps the other core
loaded.  The bench appends phase lines at random intervals and polls the job's state until
it is stopped (or continued), then prints p50/p99 beside the figure ``status`` shows for the
source (write seen → decided and signalled), and the same for a rule that is not immediate
(the tick).  The immediate rule is measured twice: with the reflex process acting on the
change, and with it off (``reflex_process: false``), the decision thread acting.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from arbiter_testing.node import PYTHON, HarnessNode
from arbiter_testing.reaction import percentile as pct
from arbiter_testing.reaction import phase_reactions
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--changes", type=int, default=40)
    parser.add_argument("--tick", type=float, default=2.0)
    args = parser.parse_args()
    load = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # the other core is busy
    try:
        watch, daemon = measure(True, args.changes, args.tick)
        inside, inside_daemon = measure(True, args.changes, args.tick, reflex_process=False)
        tick, _ = measure(False, max(6, args.changes // 5), args.tick)
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


if __name__ == "__main__":
    main()
