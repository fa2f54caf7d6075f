"""How exactly the SDK's Duty holds a duty: the llmbatch stand-in at duties 0.1…0.9 with
5, 20 and 100 ms units.

    uv run python bench/duty_accuracy.py [--seconds 3]

Each cell runs generation steps of the stand-in model (pure Python, CPU) under
``Duty.set(d)`` for about ``--seconds``, over a whole number of units (each with its idle),
and measures the duty as the thread's CPU time over wall time.  It prints |measured − asked|
per cell.  Goal: within 0.02 everywhere for 20 ms units.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "llmbatch"))

from llmbatch.standin import StandInModel

from arbiter.sdk import Duty

DUTIES = [round(0.1 * i, 1) for i in range(1, 10)]
UNITS_MS = [5, 20, 100]


def step_seconds(model: StandInModel, reps: int = 5) -> float:
    started = time.thread_time()
    for _ in range(reps):
        model.next_token()
    return (time.thread_time() - started) / reps


def model_for(unit_ms: float) -> StandInModel:
    """A stand-in whose generation step lasts about ``unit_ms`` (width ∝ √time)."""
    width = 64
    for _ in range(4):
        took = step_seconds(StandInModel(width))
        width = max(8, int(width * (unit_ms / 1000 / took) ** 0.5))
    return StandInModel(width)


def cell(model: StandInModel, duty_value: float, seconds: float) -> float:
    duty = Duty()
    duty.set(duty_value)
    wall0, cpu0 = time.monotonic(), time.thread_time()
    while time.monotonic() - wall0 < seconds:
        with duty.unit():
            model.next_token()
    return (time.thread_time() - cpu0) / (time.monotonic() - wall0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    print("|measured - asked| (measured duty = thread CPU time / wall time)")
    print("unit    " + "".join(f"{d:>7.1f}" for d in DUTIES) + "    worst")
    for unit_ms in UNITS_MS:
        model = model_for(unit_ms)
        actual_ms = 1000 * step_seconds(model)
        errors = [abs(cell(model, d, args.seconds) - d) for d in DUTIES]
        print(f"{actual_ms:5.1f}ms " + "".join(f"{e:7.3f}" for e in errors) + f"  {max(errors):7.3f}")


if __name__ == "__main__":
    main()
