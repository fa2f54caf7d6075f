"""A cooperative job whose cost to the protected stand-in is known, for the A/B harness tests.

It holds its duty with the SDK's :class:`Duty` on the CPU, and after each unit writes
``gain · duty²`` to the stand-in's ``--slow-file`` (which the stand-in, run with
``--slow-fresh-s``, obeys only while it is fresh).  So while the job runs at duty d the
stand-in is slowed by ``gain · d²`` of each frame, and while it is paused, not at all: the
harness has an effect of known size to find, whatever the machine's own noise adds.

Usage: ``python slowing_job.py SLOW_FILE GAIN``
"""

from __future__ import annotations

import os
import sys
import time

from arbiter.sdk import Control, Duty, Stopped

UNIT_S = 0.005


def spin(seconds: float) -> None:
    """``seconds`` of this thread's CPU time: the unit of work the cpu_time reader counts."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def tell(path: str, slowdown: float) -> None:
    partial = f"{path}.{os.getpid()}"
    with open(partial, "w") as fh:
        fh.write(f"{slowdown:.6f}")
    os.replace(partial, path)  # the stand-in never reads half a number


def main(slow_file: str, gain: float) -> int:
    ctl = Control()
    duty = Duty(ctl, device="cpu")
    try:
        while True:
            with duty.unit():
                spin(UNIT_S)
            tell(slow_file, gain * duty.duty**2)
    except Stopped:
        ctl.acknowledge_stop()
        return 0
    finally:
        duty.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2])))
