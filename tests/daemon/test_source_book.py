"""Which reading of a source counts (the daemon's, a helper's), its rate and its latency."""

from __future__ import annotations

import time

import pytest

from arbiter.daemon.sources import SourceBook, percentiles
from arbiter.plugin import SourceState

KEY = ("trainer", 0)
HELPER = (1000, 1)


def book() -> SourceBook:
    b = SourceBook()
    b.sync({KEY: ("jsonl", 1), ("trainer", -1): ("jsonl", 1)}, {"trainer": frozenset({1000})})
    return b


def test_the_daemons_own_reading_counts_when_it_reads() -> None:
    b = book()
    assert b.own(KEY, SourceState(readable=True, phase="on", changed_at=1.0), "watch")
    b.helper(HELPER, KEY, SourceState(readable=True, phase="off", changed_at=2.0))
    obs = b.observed(KEY, time.monotonic())
    assert obs.phase == "on" and obs.seen_by == "watch"
    assert b.view("trainer", time.monotonic())[1]["read_by"] == "daemon"


def test_a_helper_counts_while_the_daemon_cannot_read_and_until_it_leaves() -> None:
    b = book()
    b.own(KEY, SourceState(readable=False, why="permission denied", needs_helper=True), "tick")
    assert not b.observed(KEY, 0).readable
    assert b.helper(HELPER, KEY, SourceState(readable=True, phase="soon", changed_at=time.monotonic()))
    assert b.observed(KEY, 0).phase == "soon"
    assert b.view("trainer", 0)[1]["read_by"] == "helper (uid 1000)"
    assert b.helper_gone(HELPER)
    obs = b.observed(KEY, 0)
    assert not obs.readable and obs.needs_helper  # fail safe again


def test_a_helper_that_cannot_read_either_adds_its_why() -> None:
    b = book()
    b.own(KEY, SourceState(readable=False, why="denied", needs_helper=True), "tick")
    b.helper(HELPER, KEY, SourceState(readable=False, why="no such file"))
    assert "the helper (uid 1000) cannot read it either: no such file" in b.observed(KEY, 0).why


def test_a_tick_reading_never_replaces_a_newer_watch_reading() -> None:
    b = book()
    b.own(KEY, SourceState(readable=True, phase="on", changed_at=10.0), "watch")
    assert not b.own(KEY, SourceState(readable=True, phase="off", changed_at=5.0), "tick")
    assert b.observed(KEY, 0).phase == "on"
    b.own(KEY, SourceState(readable=True, phase="on", changed_at=10.0), "tick")
    assert b.observed(KEY, 0).seen_by == "watch"  # the same news: who saw it first stays


def test_latency_from_the_change_to_the_decision_per_source() -> None:
    b = book()
    b.own(KEY, SourceState(readable=True, phase="off", changed_at=1.0), "tick")
    assert b.decided(2.0) == []  # a first reading is no write's consequence
    seen = time.monotonic()
    b.own(KEY, SourceState(readable=True, phase="on", changed_at=seen), "watch")
    [ms] = b.decided(seen + 0.004)
    assert ms == pytest.approx(4.0)
    assert b.decided(seen + 1) == []  # decided once
    lat = b.view("trainer", 0)[1]["latency"]
    assert lat["count"] == 1 and lat["p50_ms"] == pytest.approx(4.0)


def test_rate_from_counts_or_from_the_source() -> None:
    b = book()
    progress = ("trainer", -1)
    start = time.monotonic()
    b.own(progress, SourceState(readable=True, count=0), "tick")
    b.slots[progress].samples.clear()
    b.slots[progress].samples.extend([(start - 40, 0), (start - 10, 120), (start, 160)])
    assert b.observed(progress, start).rate == pytest.approx(4.0)
    b.slots[progress].samples.clear()
    b.slots[progress].samples.extend([(start - 5, 0), (start, 20)])
    assert b.observed(progress, start).rate is None  # under half a window: too little to say
    b.own(progress, SourceState(readable=True, rate=2.5, changed_at=start), "watch")
    assert b.observed(progress, start).rate == 2.5


def test_sync_drops_sources_no_rule_has() -> None:
    b = book()
    b.sync({KEY: ("log", 1)}, {})
    assert set(b.slots) == {KEY} and b.slots[KEY].kind == "log"


def test_a_helper_counts_only_for_the_user_running_the_program() -> None:
    b = book()
    b.own(KEY, SourceState(readable=False, why="~ is not here"), "tick")
    b.helper((1001, 1), KEY, SourceState(readable=True, phase="off", changed_at=1.0))
    assert not b.observed(KEY, 0).readable  # uid 1001 does not run trainer
    b.sync({KEY: ("jsonl", 1), ("trainer", -1): ("jsonl", 1)}, {"trainer": frozenset({1001})})
    assert b.observed(KEY, 0).readable


def test_where_two_users_run_the_program_any_helpers_on_phase_wins() -> None:
    """A system account (uid 6) starts a process the rule matches and has its helper say
    "off": uid 1000's "on" still counts, whatever the uids' order."""
    b = book()
    b.sync({KEY: ("jsonl", 1), ("trainer", -1): ("jsonl", 1)}, {"trainer": frozenset({6, 1000})})
    b.own(KEY, SourceState(readable=False, why="~ is not here"), "tick")
    b.helper((1000, 1), KEY, SourceState(readable=True, phase="on", changed_at=1.0))
    b.helper((6, 2), KEY, SourceState(readable=True, phase="off", changed_at=2.0))
    assert b.observed(KEY, 0).phase == "on"
    assert b.view("trainer", 0)[1]["read_by"] == "helper (uid 1000)"
    b.helper((6, 2), KEY, SourceState(readable=True, phase="soon", changed_at=3.0))
    assert b.observed(KEY, 0).phase == "on"
    b.helper((1000, 1), KEY, SourceState(readable=True, phase="off", changed_at=4.0))
    assert b.observed(KEY, 0).phase == "soon"  # the most cautious of what they say


def test_a_reloaded_rule_forgets_what_helpers_said() -> None:
    b = book()
    b.own(KEY, SourceState(readable=False, why="denied", needs_helper=True), "tick")
    b.helper(HELPER, KEY, SourceState(readable=True, phase="off", changed_at=1.0))
    assert b.observed(KEY, 0).readable
    b.sync({KEY: ("jsonl", 2)}, {"trainer": frozenset({1000})})
    assert not b.observed(KEY, 0).readable


def test_an_older_helper_report_never_replaces_a_newer_one() -> None:
    b = book()
    b.own(KEY, SourceState(readable=False, why="denied", needs_helper=True), "tick")
    b.helper(HELPER, KEY, SourceState(readable=True, phase="on", changed_at=5.0))
    b.helper(HELPER, KEY, SourceState(readable=True, phase="off", changed_at=4.0))
    assert b.observed(KEY, 0).phase == "on"


def test_latency_percentiles_are_nearest_rank() -> None:
    """The p99 of a hundred latencies is the 99th of them, not the slowest (one outlier);
    the p50 of an even count is the lower middle."""
    figures = percentiles([float(v) for v in range(100, 0, -1)])
    assert figures == {"count": 100, "p50_ms": 50.0, "p99_ms": 99.0}
    assert percentiles([7.0]) == {"count": 1, "p50_ms": 7.0, "p99_ms": 7.0}
    assert percentiles([1.0, 2.0, 3.0])["p99_ms"] == 3.0


def test_a_helper_never_stands_in_for_another_users_unreadable_reading() -> None:
    """uid 1000 runs the program and its own reading is unreadable (its file not written yet,
    or no helper of its own): uid 6 also runs it and has its helper say "off".  That speaks
    for uid 6 alone: the reading stays unreadable, and says whose reading is missing."""
    b = book()
    b.sync({KEY: ("jsonl", 1)}, {"trainer": frozenset({6, 1000})})
    b.own(KEY, SourceState(readable=False, why="~/phase.jsonl is not there"), "tick")
    b.helper((6, 2), KEY, SourceState(readable=True, phase="off", changed_at=2.0))
    seen = b.observed(KEY, 0)
    assert not seen.readable and "uid 1000 runs the program and has no helper reading" in seen.why, seen
    b.helper((1000, 1), KEY, SourceState(readable=False, why="not written yet"))
    seen = b.observed(KEY, 0)
    assert not seen.readable and "its helper cannot read it either: not written yet" in seen.why, seen
    b.helper((1000, 1), KEY, SourceState(readable=True, phase="off", changed_at=3.0))
    assert b.observed(KEY, 0).readable and b.observed(KEY, 0).phase == "off"
    # the daemon's own user runs it too: only the daemon reads for it
    b.sync({KEY: ("jsonl", 1)}, {"trainer": frozenset({0, 1000})})
    b.helper((1000, 1), KEY, SourceState(readable=True, phase="off", changed_at=4.0))
    assert not b.observed(KEY, 0).readable
