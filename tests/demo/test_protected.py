"""The protected stand-in's frames paced with ``--catch-up``: its rate is what was asked beside a busy
core, and only the slow file moves it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from arbiter.demo.protected import _slowdown

SPIN = "import time\nwhile True: pass"


def rate(events: Path, *extra: str, seconds: float = 2.0) -> float:
    """Frames a second over ``seconds``, counted from the events' own times."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "arbiter.demo.protected",
            "--events",
            str(events),
            "--no-pin",
            "--frame-s",
            "0.01",
            "--catch-up",
            "--step-s",
            "0",
            "--seconds",
            str(seconds + 0.5),
            *extra,
        ]
    )
    try:
        proc.wait(timeout=60)
    finally:
        proc.kill()
    times: list[float] = [json.loads(line)["t"] for line in events.read_text().splitlines()]
    settled = [t for t in times if t >= times[0] + 0.5]  # past its start-up
    # late frames are made up at once, in a burst: one that straddles the window's start
    # would count frames due before it, so the window starts at a frame the next one waited for
    start = next(i for i in range(len(settled) - 1) if settled[i + 1] - settled[i] >= 0.005)
    window = settled[start:]
    return (len(window) - 1) / (window[-1] - window[0])


def test_a_catching_up_stand_in_keeps_its_rate_beside_busy_cores_and_the_slow_file_alone_moves_it(
    tmp_path: Path,
) -> None:
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(2)]  # every core busy
    try:
        plain = rate(tmp_path / "plain.jsonl")
        slow = tmp_path / "slow"
        slow.write_text("0.25")
        slowed = rate(tmp_path / "slowed.jsonl", "--slow-file", str(slow))
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    print(f"caught up: {plain:.1f}/s; slowed by 0.25: {slowed:.1f}/s")
    assert abs(plain - 100) < 3  # 100 frames a second, late wake-ups caught up
    assert abs(slowed - 80) < 3  # each frame 1.25 times as long


def test_the_slow_file_counts_only_while_fresh(tmp_path: Path) -> None:
    slow = tmp_path / "slow"
    assert _slowdown(str(slow)) == 0.0  # none yet
    slow.write_text("0.5")
    assert _slowdown(str(slow), fresh_s=5) == 0.5
    written = time.time() - 0.3
    os.utime(slow, (written, written))  # written 0.3 s ago, without waiting for it
    assert _slowdown(str(slow), fresh_s=0.2) == 0.0 and _slowdown(str(slow)) == 0.5
