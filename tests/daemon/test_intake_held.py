"""A progress stream's reports that move only its count do not wake the decision thread each:
the latest is held and taken with the tick; a change a decision acts on is handed at once."""

from __future__ import annotations

import time
from types import SimpleNamespace

from arbiter.daemon.inbox import SourceReport
from arbiter.daemon.intake import Intake
from arbiter.daemon.snapshot import Published, Snapshot
from arbiter.daemon.sources import PROGRESS, SourceBook
from arbiter.engine.types import Policy
from arbiter.plugin import SourceState
from arbiter.pluginmanager import build_plugin_manager

KEY = ("trainer", PROGRESS)


def intake() -> Intake:
    book = SourceBook()
    book.sync({KEY: ("jsonl", 1)}, {"trainer": frozenset({1000})})
    return Intake(build_plugin_manager(entry_points=False), book, Published(Policy()), lambda *_: None)


def reports(taken: Intake) -> list[SourceState]:
    out = []
    while not taken.inbox.empty():
        message = taken.inbox.get_nowait()
        assert isinstance(message, SourceReport)
        out.append(message.state)
    return out


def test_reports_that_move_only_a_count_wake_the_decision_thread_once_and_the_tick_takes_the_latest() -> None:
    taken = intake()
    for count in range(1, 1001):
        taken.on_source("trainer", PROGRESS, SourceState(readable=True, count=count, changed_at=time.monotonic()))
    first = reports(taken)
    assert [s.count for s in first] == [1]  # the first: what a decision acts on was new
    taken.book.own(KEY, first[0], "watch")
    taken.take_held()  # as the decision thread does with each tick
    assert taken.book.state(KEY) is not None and taken.book.state(KEY).count == 1000  # type: ignore[union-attr]
    assert taken.book.observed(KEY, time.monotonic()).seen_by == "watch"
    taken.take_held()  # nothing held twice
    assert taken.book.state(KEY).count == 1000  # type: ignore[union-attr]


def test_a_report_that_changes_what_a_decision_acts_on_is_handed_over_at_once() -> None:
    taken = intake()
    taken.on_source("trainer", PROGRESS, SourceState(readable=True, count=1, changed_at=1.0))
    taken.on_source("trainer", PROGRESS, SourceState(readable=True, count=2, changed_at=2.0))
    taken.on_source("trainer", PROGRESS, SourceState(readable=False, count=2, why="gone", changed_at=3.0))
    taken.on_source("trainer", PROGRESS, SourceState(readable=True, count=3, changed_at=4.0))
    handed = reports(taken)
    assert [(s.readable, s.count) for s in handed] == [(True, 1), (False, 2), (True, 3)]
    for state in handed:
        taken.take(SourceReport(KEY, state))
    taken.take_held()  # the count-only report in between was superseded: nothing older comes after
    assert taken.book.state(KEY).count == 3  # type: ignore[union-attr]


def test_while_a_paired_run_measures_every_count_is_handed_over_at_once() -> None:
    taken = intake()
    running = SimpleNamespace(state=SimpleNamespace(ab=SimpleNamespace(running=True)))
    taken.published.snapshot = Snapshot(decision=running)  # type: ignore[arg-type]  # what the intake reads of it
    for count in range(1, 4):
        taken.on_source("trainer", PROGRESS, SourceState(readable=True, count=count, changed_at=float(count)))
    assert [s.count for s in reports(taken)] == [1, 2, 3]  # each of its decisions reads the count


def test_a_report_handed_over_before_a_held_one_and_taken_after_it_does_not_move_the_count_back() -> None:
    taken = intake()
    taken.on_source("trainer", PROGRESS, SourceState(readable=True, count=100, changed_at=1.0))
    taken.on_source("trainer", PROGRESS, SourceState(readable=True, count=105, why="slow", changed_at=2.0))
    taken.on_source("trainer", PROGRESS, SourceState(readable=True, count=110, why="slow", changed_at=3.0))
    handed = reports(taken)  # 100 and 105 queued; 110 held
    taken.take(SourceReport(KEY, handed[0]))
    taken.take_held()  # the tick came before the queued report was taken
    taken.take(SourceReport(KEY, handed[1]))
    assert taken.book.state(KEY).count == 110  # type: ignore[union-attr]
