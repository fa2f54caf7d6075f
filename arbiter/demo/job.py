"""A stand-in fleet job: units of CPU work, holding the duty of its control document when it
has one (through the SDK's Duty: paused, stopped and throttled at a unit's end)."""

from __future__ import annotations

import argparse
import time

from arbiter.demo.protected import pin_to_first_cpu, work_cpu
from arbiter.sdk import Control, Duty, Stopped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--unit-s", type=float, default=0.02, help="CPU time of one unit of work")
    parser.add_argument("--seconds", type=float, default=0, help="exit after this long (0: run until stopped)")
    parser.add_argument(
        "--plain", action="store_true", help="ignore the control document (a job that cannot cooperate)"
    )
    args = parser.parse_args(argv)
    pin_to_first_cpu()
    ctl = None if args.plain else Control()
    duty = Duty(ctl, device="cpu") if ctl is not None else None
    started = time.monotonic()
    done = 0
    try:
        while not args.seconds or time.monotonic() - started < args.seconds:
            if duty is not None:
                with duty.unit():
                    work_cpu(args.unit_s)
            else:
                work_cpu(args.unit_s)
            done += 1
            if ctl is not None and done % 50 == 0:
                ctl.progress(done)
    except Stopped:
        return ctl.acknowledge_stop() if ctl else 0
    finally:
        if duty is not None:
            duty.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
