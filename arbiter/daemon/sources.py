"""What every source of every rule reads now, who read it, its rate and its reaction latency.

Owned by the decision thread: readings arrive from the sources' own threads (through the
inbox), from the tick, and from session helpers; this book keeps, per source, the daemon's
own reading and each helper's, and says which one counts:

- the daemon's own reading, when it reads;
- else the connected helpers' readable reports, when every user that runs the rule's
  program has one (a helper reads what the daemon may not, for its own user alone);
- else the daemon's own reading, unreadable: fail safe.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from arbiter.engine.progress import Sample, rate
from arbiter.engine.types import SeenBy, SourceObs
from arbiter.plugin import SourceState

#: (rule id, index): index -1 is the rule's progress source, -2 its busy probe, 0… its
#: ``during`` sources
SlotKey = tuple[str, int]
PROGRESS = -1
BUSY = -2
#: (uid, session number) of a session helper
HelperKey = tuple[int, int]

LATENCY_WINDOW = 1000
#: upper bounds (ms) of the cumulative write-to-decision histogram each source keeps for /metrics
LATENCY_BUCKETS_MS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0)
RATE_WINDOW_S = 60.0
_SAMPLES = 4096


def slot_name(index: int) -> str:
    return {PROGRESS: "progress", BUSY: "busy"}.get(index, f"during.{index}")


def percentiles(values: list[float]) -> dict[str, Any]:
    """p50 and p99 of ``values`` (ms), as status shows them."""
    if not values:
        return {"count": 0, "p50_ms": None, "p99_ms": None}
    ordered = sorted(values)

    def pct(p: float) -> float:
        # nearest rank: the p99 of a hundred is the 99th, not the slowest
        return round(ordered[max(0, math.ceil(p * len(ordered)) - 1)], 3)

    return {"count": len(ordered), "p50_ms": pct(0.50), "p99_ms": pct(0.99)}


def state_problem(state: object) -> str:
    """What is wrong with what a source handed over, or "": a state of another type, or
    with counts, rates or values no source can have, must count as unreadable, never as
    "phase off" or "idle"."""
    if not isinstance(state, SourceState):
        return f"it gave {type(state).__name__}, not a SourceState"
    if not isinstance(state.count, int) or isinstance(state.count, bool) or state.count < 0:
        return f"count is {state.count!r}, not a whole number from 0"
    if state.rate is not None and (
        not isinstance(state.rate, (int, float)) or not math.isfinite(state.rate) or state.rate < 0
    ):
        return f"rate is {state.rate!r}, not a finite number from 0"
    if state.phase not in (None, "on", "off", "soon"):
        return f"phase is {state.phase!r}, not on, off, soon or none"
    if state.busy not in (None, True, False):
        return f"busy is {state.busy!r}, not true, false or none"
    if not isinstance(state.changed_at, (int, float)) or not math.isfinite(state.changed_at):
        return f"changed_at is {state.changed_at!r}, not a monotonic time"
    if not isinstance(state.read_at, (int, float)) or not math.isfinite(state.read_at):
        return f"read_at is {state.read_at!r}, not a monotonic time"
    if state.read_at > time.monotonic() + 1.0:  # a wall time would pass any reading as fresh
        return f"read_at is {state.read_at!r}, in the future: not a time.monotonic() reading"
    return ""


def checked(state: object) -> SourceState:
    """``state``, or an unreadable one saying what was wrong with it."""
    problem = state_problem(state)
    if not problem:
        return state  # type: ignore[return-value]
    return SourceState(readable=False, why=f"its source returned garbage: {problem}", changed_at=time.monotonic())


def says(st: SourceState) -> str:
    """What a readable source says now, in a word or two: its phase, a busy probe's busy or
    idle with why (the lists it counted), or only that it reads (a progress source, whose
    rate is shown beside it)."""
    if st.phase:
        return st.phase
    if st.busy is not None:
        word = "busy" if st.busy else "idle"
        return f"{word} ({st.why})" if st.why else word
    return "reads"


@dataclass(frozen=True)
class Reading:
    """One reading of a source by one reader."""

    state: SourceState
    seen_by: SeenBy


@dataclass
class LatencyHistogram:
    """Every latency since the slot began, in cumulative buckets (Prometheus' shape): the
    window of the last 1000 gives percentiles, this gives rates over any period."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_MS) + 1))  # the last is +Inf
    sum_ms: float = 0.0

    def add(self, ms: float) -> None:
        i = next((i for i, bound in enumerate(LATENCY_BUCKETS_MS) if ms <= bound), len(LATENCY_BUCKETS_MS))
        self.counts[i] += 1
        self.sum_ms += ms

    def cumulative(self) -> list[tuple[float, int]]:
        out, total = [], 0
        for bound, n in zip((*LATENCY_BUCKETS_MS, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


def _caution(state: SourceState) -> tuple[int, int]:
    """How cautious a reading is: a phase on, then soon, then none or off; busy before idle."""
    return {"on": 2, "soon": 1}.get(state.phase or "", 0), 1 if state.busy is not False else 0


@dataclass
class Slot:
    kind: str
    serial: int = 0  # which loading of its rule: a reloaded rule starts over
    own: Reading = field(default_factory=lambda: Reading(SourceState(readable=False, why="not read yet"), "tick"))
    helpers: dict[HelperKey, Reading] = field(default_factory=dict)  # each helper's last report
    read_by: str = "daemon"
    samples: deque[Sample] = field(default_factory=lambda: deque(maxlen=_SAMPLES))
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    histogram: LatencyHistogram = field(default_factory=LatencyHistogram)

    def effective(self, owners: frozenset[int], daemon_uid: int = 0) -> tuple[Reading, str]:
        """The reading that counts.  A helper speaks only for its own user's processes: where
        the daemon cannot read, every user that runs the rule's program must have a readable
        report of its own helper, else the reading stays unreadable (fail safe); the daemon's
        own user has no helper but the daemon.  Of those reports the most cautious counts (a
        phase on before soon before off, busy before idle): any user can start a process the
        rule matches and have a helper of theirs report, but never to lift another user's
        protection, nor to stand in for a reading that user lacks."""
        helpers = {k: r for k, r in self.helpers.items() if k[0] in owners}
        if self.own.state.readable or not helpers:
            return self.own, "daemon"
        readable = [(key, r) for key, r in sorted(helpers.items()) if r.state.readable]
        unread = sorted(uid for uid in owners if uid not in {k[0] for k, _ in readable})
        if readable and not unread:
            (uid, _), reading = max(readable, key=lambda item: _caution(item[1].state))  # the first of equals
            return reading, f"helper (uid {uid})"
        if daemon_uid in unread and readable:
            why = f"{self.own.state.why}; the daemon's own user runs the program and only the daemon reads for it"
        elif readable:
            uid = min(unread)
            said = [r.state.why for k, r in sorted(helpers.items()) if k[0] == uid]
            why = f"{self.own.state.why}; uid {uid} runs the program and " + (
                f"its helper cannot read it either: {said[0]}" if said else "has no helper reading for it"
            )
        else:
            (uid, _), reading = min(helpers.items())
            why = f"{self.own.state.why}; the helper (uid {uid}) cannot read it either: {reading.state.why}"
        return Reading(replace(self.own.state, why=why), self.own.seen_by), "daemon"


class SourceBook:
    def __init__(self, rate_window_s: float = RATE_WINDOW_S, daemon_uid: int | None = None) -> None:
        self.daemon_uid = os.geteuid() if daemon_uid is None else daemon_uid  # its reading is the daemon's own
        self.rate_window_s = rate_window_s  # the governor's period: its rates are over one
        self.slots: dict[SlotKey, Slot] = {}
        self._pending: dict[SlotKey, float] = {}  # changes not yet decided on → when they were seen
        self.latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)  # every source's, together
        self.owners: dict[str, frozenset[int]] = {}  # rule id → uids running its program

    def sync(self, wanted: dict[SlotKey, tuple[str, int]], owners: dict[str, frozenset[int]]) -> None:
        """Keep a slot for each source the rules in force have (key → kind, rule serial);
        a rule loaded anew starts with nothing, helpers' reports included."""
        self.owners = owners
        for key in list(self.slots):
            if (self.slots[key].kind, self.slots[key].serial) != wanted.get(key):
                del self.slots[key]
                self._pending.pop(key, None)
        for key, (kind, serial) in wanted.items():
            self.slots.setdefault(key, Slot(kind, serial))

    def _effective(self, key: SlotKey, slot: Slot) -> tuple[Reading, str]:
        return slot.effective(self.owners.get(key[0], frozenset()), self.daemon_uid)

    def _update(self, key: SlotKey, change: Any) -> bool:
        slot = self.slots.get(key)
        if slot is None:
            return False
        before, before_by = self._effective(key, slot)
        change(slot)
        after, after_by = self._effective(key, slot)
        if after_by != before_by:
            slot.samples.clear()  # counts of two readers are not comparable
        if not slot.samples or slot.samples[-1][1] != after.state.count:
            slot.samples.append((time.monotonic(), after.state.count))
        changed = (before.state.readable, before.state.phase, before.state.busy) != (
            after.state.readable,
            after.state.phase,
            after.state.busy,
        )
        slot.read_by = after_by
        if changed and after.state.changed_at > 0 and before.state.changed_at > 0:  # not a first reading
            self._pending[key] = after.state.changed_at
        return changed

    def own(self, key: SlotKey, state: SourceState, seen_by: SeenBy) -> bool:
        """The daemon's own reading; True when what counts changed (readability or phase).

        Neither a tick's reading nor an older watch report (one handed over before a report
        held for the tick, and taken after it) replaces a newer one a watch handed over."""
        state = checked(state)

        def apply(slot: Slot) -> None:
            if slot.own.seen_by == "watch" and state.changed_at < slot.own.state.changed_at:
                return
            if seen_by == "tick" and replace(state, changed_at=0.0) == replace(slot.own.state, changed_at=0.0):
                return  # nothing new: keep who saw it first
            slot.own = Reading(state, seen_by)

        return self._update(key, apply)

    def helper(self, helper: HelperKey, key: SlotKey, state: SourceState) -> bool:
        state = checked(state)

        def apply(slot: Slot) -> None:
            held = slot.helpers.get(helper)
            if held is not None and state.changed_at < held.state.changed_at:
                return  # an older snapshot that crossed a newer report on the way
            slot.helpers[helper] = Reading(state, "watch")

        return self._update(key, apply)

    def helper_gone(self, helper: HelperKey) -> bool:
        changed = False
        for key, slot in self.slots.items():
            if helper in slot.helpers:
                changed |= self._update(key, lambda s: s.helpers.pop(helper, None))
        return changed

    def observed(self, key: SlotKey, now: float) -> SourceObs:
        slot = self.slots.get(key)
        if slot is None:
            return SourceObs(readable=False, why="not read yet")
        reading, _ = self._effective(key, slot)
        st = reading.state
        return SourceObs(
            st.readable,
            st.phase,
            st.why,
            st.needs_helper,
            reading.seen_by,
            st.changed_at,
            self.rate(key, slot, now),
            st.count,
            st.busy,
        )

    def state(self, key: SlotKey) -> SourceState | None:
        """The reading that counts, as the source gave it (a busy probe's model names)."""
        slot = self.slots.get(key)
        return None if slot is None else self._effective(key, slot)[0].state

    def rate(self, key: SlotKey, slot: Slot, now: float) -> float | None:
        reading, _ = self._effective(key, slot)
        if not reading.state.readable:
            return None
        if reading.state.rate is not None:
            return reading.state.rate
        # over at least half a window: a source just (re)opened says nothing yet
        return rate(list(slot.samples), now, self.rate_window_s, min_span_s=max(1.0, self.rate_window_s / 2))

    def decided(self, at: float) -> list[float]:
        """Every change waiting for a decision was just decided on: their latencies (ms)."""
        out = []
        for key, seen in self._pending.items():
            ms = (at - seen) * 1000
            out.append(ms)
            if key in self.slots:
                self.slots[key].latencies.append(ms)
                self.slots[key].histogram.add(ms)
        self._pending.clear()
        self.latencies.extend(out)
        return out

    def histograms(self) -> list[dict[str, Any]]:
        """Each source's cumulative latency histogram (ms buckets), for /metrics."""
        return [
            {
                "rule": rid,
                "slot": slot_name(index),
                "kind": slot.kind,
                "buckets": slot.histogram.cumulative(),
                "sum_ms": slot.histogram.sum_ms,
            }
            for (rid, index), slot in sorted(dict(self.slots).items())
        ]

    def view(self, rule_id: str, now: float) -> list[dict[str, Any]]:
        """Each source of a rule, as status shows it."""
        out = []
        for (rid, index), slot in sorted(dict(self.slots).items()):  # other threads ask; copy first
            if rid != rule_id:
                continue
            reading, by = self._effective((rid, index), slot)
            st = reading.state
            r = self.rate((rid, index), slot, now)
            out.append(
                {
                    "slot": slot_name(index),
                    "kind": slot.kind,
                    "readable": st.readable,
                    "why": st.why,
                    "needs_helper": st.needs_helper,
                    "phase": st.phase,
                    "busy": st.busy,
                    "says": says(st),
                    "count": st.count,
                    "rate": None if r is None else round(r, 4),
                    # a counted rate is over the last rate_window_s, and none is given before
                    # first_rate_after_s of readings (a source just opened says nothing yet)
                    "rate_window_s": self.rate_window_s,
                    "first_rate_after_s": max(1.0, self.rate_window_s / 2),
                    "read_by": by,
                    "seen_by": reading.seen_by,
                    "latency": percentiles(list(slot.latencies)),
                }
            )
        return out
