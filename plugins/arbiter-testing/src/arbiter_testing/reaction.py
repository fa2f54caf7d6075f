"""The reaction to a phase, seen from outside the daemon: what the benches measure, the phase
lines they write and the rule that reads them."""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import psutil


def percentile(values: list[float], p: float) -> float:
    """The smallest value that at least a share ``p`` of ``values`` are at or below (nearest
    rank): the p99 of a hundred values is the 99th, not the slowest."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)]


def difference_interval(
    before: list[float],
    after: list[float],
    p: float,
    rng: random.Random,
    resamples: int = 2000,
    level: float = 0.95,
    floors: tuple[list[float], list[float]] | None = None,
) -> tuple[float, float]:
    """An interval for the change of percentile ``p`` from ``before`` to ``after``, given
    that each is a sample: the central ``level`` of that change over ``resamples``
    bootstrap resamples of each (drawn with replacement, each its own size).  On a shared
    box the p99 of a few hundred reactions moves by milliseconds between two runs of the
    same code: an interval that holds 0 says a change seen once may be sampling noise.

    ``floors`` (before's, after's): samples of what the box alone adds, taken beside each;
    the change is then of each side's percentile less its floor's, each resampled too."""

    def side(values: list[float], floor: list[float]) -> float:
        at = percentile(rng.choices(values, k=len(values)), p)
        return at - percentile(rng.choices(floor, k=len(floor)), p) if floor else at

    floor_before, floor_after = floors or ([], [])
    diffs = [
        side(after, floor_after) - side(before, floor_before) for _ in range(resamples)
    ]  # percentile() orders them
    tail = (1.0 - level) / 2
    return percentile(diffs, tail), percentile(diffs, 1.0 - tail)


def phase_reactions(
    events: Path, pid: int, changes: int, rng: random.Random, poll_s: float = 0.0, timeout_s: float = 10.0
) -> list[float]:
    """Append phase lines (``{"event": "status", "phase": "on"|"off"}``, on first) to the
    watched file ``events`` at random gaps; for each, the ms from the write until process
    ``pid`` is seen stopped (on) or running again (off).  It ends with the phase off.

    ``poll_s``: how long to sleep between looks (0: look without pause; on a two-core host
    under load a light poll leaves the daemon its core)."""
    proc = psutil.Process(pid)
    out: list[float] = []
    for i in range(changes):
        time.sleep(rng.uniform(0.2, 0.5))
        on = i % 2 == 0
        started = time.monotonic()
        write_phase(events, "on" if on else "off")
        out.append(ms_until_seen(proc, on, started, poll_s, timeout_s))
    if len(out) % 2:
        write_phase(events, "off")
    return out


def ms_until_seen(
    proc: psutil.Process, stopped: bool, started: float, poll_s: float = 0.0, timeout_s: float = 10.0
) -> float:
    """The ms from ``started`` (monotonic) until ``proc`` is seen stopped, or running again;
    looking every ``poll_s`` (0: without pause)."""
    while (proc.status() == psutil.STATUS_STOPPED) != stopped:
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(
                f"pid {proc.pid} was not seen {'stopped' if stopped else 'running'} within {timeout_s:g}s"
            )
        if poll_s:
            time.sleep(poll_s)
    return 1000 * (time.monotonic() - started)


def write_phase(events: Path, phase: str) -> None:
    """Append the phase line ``{"event": "status", "phase": PHASE}`` to ``events``."""
    with open(events, "a") as fh:
        fh.write(json.dumps({"event": "status", "phase": phase}) + "\n")
