"""A stand-in fleet job: units of CPU work, obeying its control document when it has one."""

from __future__ import annotations

import argparse
import time

from arbiter.demo.protected import pin_to_first_cpu, work
from arbiter.sdk import Control, Stopped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--unit-s", type=float, default=0.02, help="CPU time of one unit of work")
    parser.add_argument("--seconds", type=float, default=0, help="exit after this long (0: run until stopped)")
    parser.add_argument("--plain", action="store_true", help="ignore the control document (a job that cannot cooperate)")
    args = parser.parse_args(argv)
    pin_to_first_cpu()
    ctl = None if args.plain else Control()
    started = time.monotonic()
    done = 0
    try:
        while not args.seconds or time.monotonic() - started < args.seconds:
            if ctl is not None:
                ctl.safe_point()
            work(args.unit_s)
            done += 1
            if ctl is not None and done % 50 == 0:
                ctl.progress(done)
    except Stopped:
        return ctl.acknowledge_stop() if ctl else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
