"""A protected stand-in: works in frames on the CPU and logs each to a JSONL file.

Each frame is ``--step-s`` of work then ``--gap-s`` idle (a program that leaves part of its
core free, as a renderer or a game does).  With ``--frame-s`` the frames are paced as a game
paces them: each is ``--step-s`` of CPU time, then it waits for the next frame's start; a
frame that overruns its slot is late, and the next starts at once (no catching up), unless
``--catch-up`` is given: then late frames are made up (up to a second's stall), so the rate
is what was asked whatever the scheduler's latency (a stand-in whose rate only
``--slow-file`` moves).  While ``--idle-flag`` exists it idles (as a program between
bursts would).  ``--slow-file`` slows it on purpose: while it holds a number x, each frame
lasts x times its length more (with ``--slow-fresh-s``, only while the file was written that
recently: a writer that stops, as a paused job does, stops slowing it).  Phases are written
to the same file by whoever drives it (``status`` events with ``state.phase``).
"""

from __future__ import annotations

import argparse
import json
import os
import time

#: with ``--catch-up``, a frame later than this is not made up: the schedule starts again
CATCH_UP_S = 1.0


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


def work_cpu(seconds: float) -> None:
    """``seconds`` of this thread's CPU time: under contention it takes longer, as a frame's
    fixed work does."""
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        x += 1


def _slowdown(path: str, fresh_s: float = 0.0) -> float:
    try:
        with open(path) as fh:
            if fresh_s and time.time() - os.fstat(fh.fileno()).st_mtime > fresh_s:
                return 0.0
            return max(0.0, float(fh.read().strip() or 0))
    except (OSError, ValueError):
        return 0.0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", required=True, help="JSONL file to append step events to")
    parser.add_argument("--idle-flag", default="", help="idle while this file exists")
    parser.add_argument("--step-s", type=float, default=0.02, help="CPU time of one step")
    parser.add_argument("--gap-s", type=float, default=0.0, help="idle after each step")
    parser.add_argument(
        "--frame-s",
        type=float,
        default=0.0,
        help="pace frames to this period, each --step-s of CPU time (--gap-s is then unused)",
    )
    parser.add_argument(
        "--catch-up",
        action="store_true",
        help="with --frame-s, make up late frames (a rate that only --slow-file moves)",
    )
    parser.add_argument("--slow-file", default="", help="while it holds x, each frame idles x times longer")
    parser.add_argument(
        "--slow-fresh-s",
        type=float,
        default=0.0,
        help="the slow file counts only while written within this many seconds (0: always)",
    )
    parser.add_argument("--no-pin", action="store_true", help="do not pin to the first CPU")
    parser.add_argument("--seconds", type=float, default=0, help="exit after this long (0: run until killed)")
    args = parser.parse_args(argv)
    if not args.no_pin:
        pin_to_first_cpu()
    started = time.monotonic()
    fd = os.open(args.events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    step = 0
    frame_at = time.monotonic()
    while not args.seconds or time.monotonic() - started < args.seconds:
        if args.idle_flag and os.path.exists(args.idle_flag):
            time.sleep(0.1)
            frame_at = time.monotonic()
            continue
        slowdown = _slowdown(args.slow_file, args.slow_fresh_s) if args.slow_file else 0.0
        if args.frame_s:
            work_cpu(args.step_s)
            frame_at += args.frame_s * (1.0 + slowdown)  # slowed: a longer slot
            now = time.monotonic()
            if frame_at > now:
                time.sleep(frame_at - now)
            elif not args.catch_up or now - frame_at > CATCH_UP_S:
                frame_at = now  # late (or, catching up, stalled): the next frame starts now
        else:
            work(args.step_s)
            if args.gap_s:
                time.sleep(args.gap_s)
            if slowdown:
                time.sleep((args.step_s + args.gap_s) * slowdown)
        step += 1
        os.write(fd, (json.dumps({"t": time.time(), "event": "step_done", "step": step}) + "\n").encode())


if __name__ == "__main__":
    main()
