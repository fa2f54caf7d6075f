"""Latency from a phase line's write to the jsonl source's on_change call.

    uv run python bench/plugin_jsonl_latency.py [--writes 200]

A separate writer process appends phase lines (alternating on and off), each carrying its
monotonic write time; the source's on_change records when it saw each change.  Prints
p50/p99 in microseconds.  CLOCK_MONOTONIC is system-wide, so the two processes' times compare.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from arbiter.plugin import PluginContext, SourceState
from arbiter_sources import JsonlSource

_WRITER = """
import json, os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)
for i in range(int(sys.argv[2])):
    phase = "uploading" if i % 2 == 0 else "idle"
    os.write(fd, (json.dumps({"event": "status", "phase": phase, "i": i, "mono": time.monotonic()}) + "\\n").encode())
    time.sleep(0.01)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--writes", type=int, default=200)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="arbiter-bench-jsonl-"))
    path = directory / "events.jsonl"
    path.touch()
    options = JsonlSource.Options.model_validate(
        {"kind": "jsonl", "path": str(path), "event": "status", "field": "phase", "on": ["uploading"]}
    )
    source = JsonlSource(options, PluginContext(state_dir=directory))
    seen: list[float] = []
    done = threading.Event()

    def on_change(state: SourceState) -> None:
        seen.append(time.monotonic())
        if state.count >= args.writes:
            done.set()

    source.start(on_change)
    try:
        subprocess.run([sys.executable, "-c", _WRITER, str(path), str(args.writes)], check=True)
        done.wait(10)
    finally:
        source.close()
    written = [json.loads(line)["mono"] for line in path.read_text().splitlines()]
    if len(seen) != len(written):
        print(f"saw {len(seen)} changes for {len(written)} writes (some writes were read together)")
    latencies = sorted((s - w) * 1e6 for s, w in zip(seen, written, strict=False))
    p50, p99 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]
    print(
        f"jsonl write -> on_change over {len(latencies)} writes (writer in another process): "
        f"p50 {p50:.0f} µs, p99 {p99:.0f} µs"
    )


if __name__ == "__main__":
    main()
