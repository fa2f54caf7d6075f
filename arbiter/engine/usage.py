"""Whether a program uses the GPU: busy share from two readings, and hysteresis."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from arbiter.engine.types import RuleObs, RuleState, evolve

BusyCounters = Mapping[int, Mapping[str, int]]  # pid → engine → cumulative busy ns


def busy_share(
    before: BusyCounters | None, before_ns: int, after: BusyCounters, after_ns: int, pids: Collection[int]
) -> float | None:
    """The share of wall time ``pids`` kept the busiest engine busy between two readings.

    A process missing from ``before`` (it started, or was first seen) counts from zero, and
    each process's delta is capped at the interval: a newly seen process may look busy once,
    which fails safe.  ``None`` when there is no earlier reading to compare with.
    """
    interval = after_ns - before_ns
    if before is None or interval <= 0:
        return None
    per_engine: dict[str, int] = {}
    for pid in pids:
        now = after.get(pid)
        if not now:
            continue
        then = before.get(pid, {})
        if now is then:
            continue  # a reader hands back the same counters for an idle process: nothing gained
        for engine, busy in now.items():
            delta = busy - then.get(engine, 0)
            if delta < 0:  # counter reset (pid reused): count from zero
                delta = busy
            per_engine[engine] = per_engine.get(engine, 0) + min(max(delta, 0), interval)
    if not per_engine:
        return 0.0
    return max(per_engine.values()) / interval


def gpu_usage(prev: RuleState, obs: RuleObs, threshold: float, release_after_s: float, now: float) -> RuleState:
    """Apply the "uses the GPU" rule: on above ``threshold`` (or unreadable, or faulty)
    while running; off only after ``release_after_s`` below it (so bursts do not flap)."""
    # a fault (a plugin failed, the process table could not be read) means we cannot tell
    busy = bool(obs.faults) or (obs.running and (obs.gpu_share is None or obs.gpu_share > threshold))
    if busy:
        since = prev.using_since if prev.using_gpu else now
        return evolve(prev, using_gpu=True, last_busy_at=now, using_since=since)
    if prev.using_gpu and prev.last_busy_at is not None and now - prev.last_busy_at < release_after_s:
        return prev
    return evolve(prev, using_gpu=False, using_since=None)
