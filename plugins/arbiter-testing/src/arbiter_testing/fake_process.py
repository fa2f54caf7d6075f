"""Running a fake program as its own process, so that a daemon can match it by its command
line: the options every fake takes (its VRAM board's file and size, the file it writes once
serving) and the loop that serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from typing import Any

from arbiter.cli.signal_relay import relay_signals
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
    stop = threading.Event()
    # on a thread of its own: this one waits without a timeout, which a signal another of
    # the fake's threads took would not break
    relay_signals({signal.SIGTERM: stop.set, signal.SIGINT: stop.set})
    fake.start()
    try:
        write_state(ready_file, {"pid": os.getpid(), "url": fake.url, **ready})
        stop.wait()
    finally:
        fake.stop()
    return 0
