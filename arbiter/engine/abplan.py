"""The design of a paired ON/OFF run, pure: the order of a block's windows,
which windows count, and when a run must stop as a slowdown (the run itself steps through
them in :mod:`arbiter.engine.abrun`).

A block is one ON and one OFF window in random order (seeded by the run, so a restarted daemon
keeps the same order); the first ``washout_s`` after each switch is discarded.  A window is
left out, and its block repeated, when something outside the fleet changed; an ON window in
which the work did not really run is left out too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Arm = Literal["on", "off"]
#: a wall clock that moved this much more than the monotonic one means the machine slept
SLEEP_JUMP_S = 2.0
#: the work must hold at least its asked duty minus this in an ON window
DUTY_SHORTFALL = 0.1
#: progress in an ON window under this share of the OFF rate is a collapse: the run stops
COLLAPSE_SHARE = 0.5
#: work that holds no duty must be seen using at least this share of the GPU in an ON window
IDLE_DUTY = 0.05
WORK_GONE = "the work did not run"


def _coin(seed: str, block_index: int) -> bool:
    """A fair coin fixed by (seed, block): FNV-1a over the text, mixed (MurmurHash3's final
    step, so similar texts give unrelated bits), its top bit."""
    mask = 0xFFFFFFFFFFFFFFFF
    h = 0xCBF29CE484222325
    for byte in f"{seed}:{block_index}".encode():
        h = ((h ^ byte) * 0x100000001B3) & mask
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & mask
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & mask
    h ^= h >> 33
    return bool(h >> 63)


def order(seed: str, block_index: int) -> tuple[Arm, Arm]:
    """The two windows of a block, in the order fixed by (seed, block)."""
    return ("on", "off") if _coin(seed, block_index) else ("off", "on")


@dataclass(frozen=True)
class WindowReading:
    """What was seen during a window's measured part."""

    events: int  # progress events of the protected program
    seconds: float
    phase_changed: bool = False
    program_restarted: bool = False
    wall_minus_monotonic_s: float = 0.0  # how much further the wall clock moved
    power_changed: bool = False
    memory_guard: bool = False
    work_duty: float | None = None  # the work's measured duty (ON windows)
    work_ran: bool = True  # some of the work ran during it (ON windows)
    unreadable: str = ""  # why progress could not be counted over the whole of it

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


def exclusion(arm: Arm, reading: WindowReading, asked_duty: float | None, needs_duty: bool = True) -> str | None:
    """Why this window must not count (its block is repeated), or None.  ``asked_duty``:
    the duty cooperative work was asked to hold (None: work that holds no duty, which must
    still be seen using the GPU); ``needs_duty`` False for CPU work (no GPU duty to see)."""
    if reading.unreadable:
        return f"progress could not be counted ({reading.unreadable})"
    if reading.phase_changed:
        return "a phase of the rule changed"
    if reading.program_restarted:
        return "the protected program restarted"
    if abs(reading.wall_minus_monotonic_s) > SLEEP_JUMP_S:
        return f"the machine slept or its clock jumped ({reading.wall_minus_monotonic_s:+.0f}s)"
    if reading.power_changed:
        return "the power source changed"
    if reading.memory_guard:
        return "the memory guard tripped"
    if arm == "on" and not reading.work_ran:
        return f"{WORK_GONE}: a certificate is never earned beside idle work"
    if arm == "on" and needs_duty and asked_duty is None:
        if reading.work_duty is None:
            return "the work's duty could not be measured"
        if reading.work_duty < IDLE_DUTY:
            return (
                f"the work used the GPU {reading.work_duty:.2f} of the time: a certificate is never earned "
                "beside idle work"
            )
    if arm == "on" and needs_duty and asked_duty is not None:
        if reading.work_duty is None:
            return "the work's duty could not be measured"
        if reading.work_duty < asked_duty - DUTY_SHORTFALL:
            return (
                f"the work ran at {reading.work_duty:.2f}, under its asked {asked_duty:.2f} − {DUTY_SHORTFALL:g}: "
                "a certificate is never earned beside idle work"
            )
        if reading.work_duty < asked_duty / 2:  # at a duty of 0.1 or less, 0 is not "asked − 0.1"
            return (
                f"the work ran at {reading.work_duty:.2f}, under half its asked {asked_duty:.2f}: "
                "a certificate is never earned beside idle work"
            )
    return None


def collapsed(on: WindowReading, off_rate: float) -> bool:
    """Progress collapsed in an ON window: the run stops as a slowdown (protection stays on)."""
    return off_rate > 0 and on.rate < COLLAPSE_SHARE * off_rate


def exclusions_mostly_on(excluded: Sequence[Arm], at_least: int = 3) -> bool:
    """Exclusions falling mostly in ON windows are reported as harm, not chance."""
    on = sum(1 for arm in excluded if arm == "on")
    return len(excluded) >= at_least and on >= 2 * len(excluded) / 3
