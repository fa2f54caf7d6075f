"""A protected stand-in: works in steps on the CPU and logs each to a JSONL file.

While ``--idle-flag`` exists it idles (as a program between bursts would); phases are
written to the same file by whoever drives it (``status`` events with ``state.phase``).
"""

from __future__ import annotations

import argparse
import json
import os
import time


def pin_to_first_cpu() -> None:
    """Contend with the demo job for one core, as two GPU programs contend for one GPU."""
    if hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        except OSError:
            pass


def work(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", required=True, help="JSONL file to append step events to")
    parser.add_argument("--idle-flag", default="", help="idle while this file exists")
    parser.add_argument("--step-s", type=float, default=0.02, help="CPU time of one step")
    parser.add_argument("--seconds", type=float, default=0, help="exit after this long (0: run until killed)")
    args = parser.parse_args(argv)
    pin_to_first_cpu()
    started = time.monotonic()
    fd = os.open(args.events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    step = 0
    while not args.seconds or time.monotonic() - started < args.seconds:
        if args.idle_flag and os.path.exists(args.idle_flag):
            time.sleep(0.1)
            continue
        work(args.step_s)
        step += 1
        os.write(fd, (json.dumps({"t": time.time(), "event": "step_done", "step": step}) + "\n").encode())


if __name__ == "__main__":
    main()
