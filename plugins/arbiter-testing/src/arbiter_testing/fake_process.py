"""Running a fake program as its own process, so that a daemon can match it by its command
line: the options every fake takes (its VRAM board's file and size, the file it writes once
serving) and the loop that serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from typing import Any

from arbiter_testing.fake_http import FakeApp
from arbiter_testing.fake_reader import write_state
from arbiter_testing.vram_board import GIB, VramBoard


def fake_parser(module: str, ready: str = "{pid, url}") -> argparse.ArgumentParser:
    """A parser for ``python -m MODULE`` with the options every fake process takes."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}")
    parser.add_argument("--state-file", required=True, help="the fake reader's state file")
    parser.add_argument("--ready-file", required=True, help=f"written with {ready} once serving")
    parser.add_argument("--total-gb", type=float, default=24.0)
    return parser


def board_of(args: argparse.Namespace) -> VramBoard:
    """The VRAM board the parsed ``--state-file`` and ``--total-gb`` name."""
    return VramBoard(args.state_file, int(args.total_gb * GIB))


def serve_until_stopped(fake: FakeApp, ready_file: str, **ready: Any) -> int:
    """Serve ``fake`` until SIGTERM or SIGINT; once it serves, ``ready_file`` holds its pid, its
    URL and ``ready``.  Returns the process's exit status."""
    stopped: list[int] = []
    # The handler takes no lock: it runs on this thread, between two steps of whatever it
    # does, which may hold that very lock.  This thread looks every 0.1 s, since a wait
    # without a timeout is not broken by a signal another of the fake's threads took.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda taken, _frame: stopped.append(taken))
    fake.start()
    try:
        write_state(ready_file, {"pid": os.getpid(), "url": fake.url, **ready})
        while not stopped:
            time.sleep(0.1)
    finally:
        fake.stop()
    return 0
