"""A running daemon's main thread sleeps until it is told to stop: it does not wake on a
timer, and a stop signal still ends the daemon at once."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from arbiter_testing.node import HarnessNode
from arbiter_testing.waiting import wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

#: seconds the main thread is watched for (it woke once a second on a timer)
WINDOW_S = 3.0


def voluntary_switches(pid: int) -> int:
    status = Path(f"/proc/{pid}/task/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("voluntary_ctxt_switches")))


def test_the_main_thread_sleeps_until_a_stop(tmp_path: Path) -> None:
    node = HarnessNode(tmp_path)
    try:
        node.start()
        assert node.daemon is not None
        pid = node.daemon.pid
        node.wait_for(lambda: node.status()["processes"] > 0, timeout=60)
        before, since = voluntary_switches(pid), time.monotonic()
        # a count over a window, not a timing: the window is what is counted
        wait_until(lambda: time.monotonic() - since >= WINDOW_S, WINDOW_S + 5, "the window", poll_s=0.1)
        woke = voluntary_switches(pid) - before
        assert woke < 2, f"the main thread woke {woke} times in {WINDOW_S:g}s with nothing to do"
        asked = time.monotonic()
        assert node.stop() == 0
        assert time.monotonic() - asked < 15
    finally:
        node.close()
