"""Which rule a process belongs to: the first whose matcher selects it, highest priority first."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from arbiter.daemon.claim import Claimer, Claims
from arbiter.plugin import KindOptions, Matcher, ProcessInfo
from arbiter.pluginmanager import PluginFailed, build_plugin_manager
from arbiter_testing.waiting import wait_until


class ByName(Matcher):
    """Selects by name, each process on its own; records what it was offered."""

    def __init__(self, names: set[str], alone: bool) -> None:
        super().__init__(KindOptions())
        self.names = names
        self.judges_each_process = alone
        self.offered: list[list[int]] = []

    def select(self, processes: Sequence[ProcessInfo]) -> set[int]:
        self.offered.append([p.pid for p in processes])
        return {p.pid for p in processes if p.name in self.names}


class Children(Matcher):
    """Selects the children of what it is offered under ``parent``: depends on other processes."""

    def __init__(self, parent: int) -> None:
        super().__init__(KindOptions())
        self.parent = parent

    def select(self, processes: Sequence[ProcessInfo]) -> set[int]:
        return {p.pid for p in processes if p.ppid == self.parent}


class Broken(Matcher):
    judges_each_process = True

    def select(self, processes: Sequence[ProcessInfo]) -> set[int]:
        raise RuntimeError("the matcher broke")


@dataclass
class _Match:
    kind: str


@dataclass
class _Rule:
    id: str
    match: _Match
    priority: int = 50


@dataclass
class Live:
    rule: _Rule
    matcher: Matcher | None
    faults: list[str] = field(default_factory=list)


def live(rid: str, matcher: Matcher | None, kind: str = "test") -> Any:
    return Live(_Rule(rid, _Match(kind)), matcher)


class Calls:
    """PluginHost.call run in place, counting the calls by label."""

    def __init__(self) -> None:
        self.labels: list[str] = []

    def __call__(self, label: str, fn: Any, *args: Any) -> Any:
        self.labels.append(label)
        try:
            return fn(*args)
        except Exception as exc:
            raise PluginFailed(label, f"{type(exc).__name__}: {exc}") from exc


def claim(rules: list[Any], table: list[ProcessInfo]) -> tuple[Any, Any]:
    return Claimer(Calls()).claim(rules, table)


TABLE = [ProcessInfo(pid=10 + i, ppid=1, name=n) for i, n in enumerate(["a", "b", "a", "c", "b"])]


def test_the_first_rule_to_select_a_process_has_it_whatever_later_ones_are_offered() -> None:
    for alone in (True, False):
        first, second, third = ByName({"a"}, alone), ByName({"a", "b"}, alone), ByName({"a", "b", "c"}, alone)
        pids, faults = claim([live("r1", first), live("r2", second), live("r3", third)], TABLE)
        assert pids == {"r1": frozenset({10, 12}), "r2": frozenset({11, 14}), "r3": frozenset({13})}
        assert faults == {"r1": [], "r2": [], "r3": []}
        if alone:  # offered everything: no list is built per rule
            assert second.offered == third.offered == [[10, 11, 12, 13, 14]]
        else:  # offered only what is left
            assert second.offered == [[11, 13, 14]] and third.offered == [[13]]


def test_a_matcher_that_looks_at_other_processes_is_offered_only_what_is_left() -> None:
    table = [
        ProcessInfo(pid=2, ppid=1, name="parent"),
        ProcessInfo(pid=3, ppid=2, name="kid"),
        ProcessInfo(pid=4, ppid=2, name="kid2"),
    ]
    pids, _ = claim([live("r1", ByName({"kid"}, True)), live("r2", Children(2))], table)
    assert pids == {"r1": frozenset({3}), "r2": frozenset({4})}


def test_a_failing_matcher_is_its_rules_fault_and_claims_nothing() -> None:
    pids, faults = claim(
        [live("bad", Broken(KindOptions()), "broken"), live("none", None), live("good", ByName({"a"}, True))], TABLE
    )
    assert pids == {"bad": frozenset(), "none": frozenset(), "good": frozenset({10, 12})}
    assert faults["bad"] == ["matchers/broken (bad): RuntimeError: the matcher broke"]
    assert faults["good"] == [] and faults["none"] == []


def test_every_matcher_runs_in_one_plugin_call() -> None:
    calls = Calls()
    rules = [live(f"r{i}", ByName({"a"}, i % 2 == 0)) for i in range(50)]
    pids, _ = Claimer(calls).claim(rules, TABLE)
    assert calls.labels == ["matchers"]
    assert pids["r0"] == frozenset({10, 12}) and all(not pids[f"r{i}"] for i in range(1, 50))


def test_a_matcher_that_judges_each_process_alone_is_offered_only_what_changed_since_the_last_tick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dataclasses import replace

    from arbiter.daemon import claim

    monkeypatch.setattr(claim, "FULL_OFFER_TICKS", 4)
    alone, tree = ByName({"a"}, True), ByName({"a", "b"}, False)
    rules = [live("r1", alone), live("r2", tree)]
    claimer = Claimer(Calls())
    table = list(TABLE)
    assert claimer.claim(rules, table)[0] == {"r1": frozenset({10, 12}), "r2": frozenset({11, 14})}
    assert claimer.claim(rules, list(table))[0] == {"r1": frozenset({10, 12}), "r2": frozenset({11, 14})}
    assert alone.offered[-1] == []  # the very same processes: nothing to judge again
    assert tree.offered[-1] == [11, 13, 14]  # one that looks at others is offered what is left, every tick
    # 12 renamed (a new object for its pid), 10 gone, 15 new: only those two are judged; 13
    # only ran (a new object, equal to the last but for its CPU time) and is not
    table = [p for p in table if p.pid != 10]
    table[1] = replace(table[1], name="b")
    table[2] = replace(table[2], cpu_ns=10_000_000)
    table.append(ProcessInfo(pid=15, ppid=1, name="a"))
    assert claimer.claim(rules, table)[0] == {"r1": frozenset({15}), "r2": frozenset({11, 12, 14})}
    assert alone.offered[-1] == [12, 15]
    assert claimer.claim(rules, list(table))[0]["r1"] == frozenset({15})
    assert alone.offered[-1] == [11, 12, 13, 14, 15]  # the fourth tick offers every process again


def test_a_rule_loaded_anew_or_whose_matcher_failed_is_offered_every_process_again() -> None:
    flaky = ByName({"a"}, True)
    rules = [live("r1", flaky)]
    claimer = Claimer(Calls())
    claimer.claim(rules, TABLE)
    reloaded = [live("r1", flaky)]  # a new rule object: what was chosen for the old one does not count
    assert claimer.claim(reloaded, TABLE)[0]["r1"] == frozenset({10, 12})
    assert flaky.offered[-1] == [10, 11, 12, 13, 14]
    broken = [live("r1", Broken(KindOptions()))]
    assert claimer.claim(broken, TABLE)[0]["r1"] == frozenset()
    assert claimer.claim(reloaded, TABLE)[0]["r1"] == frozenset({10, 12})
    assert flaky.offered[-1] == [10, 11, 12, 13, 14]


class Sleepy(Matcher):
    judges_each_process = True

    def __init__(self, release: threading.Event) -> None:
        super().__init__(KindOptions())
        self.release = release

    def select(self, processes: Sequence[ProcessInfo]) -> set[int]:
        self.release.wait(10)
        return {p.pid for p in processes}


def test_a_hung_matcher_is_named_and_the_other_rules_go_on_until_it_returns() -> None:
    # a timeout long beside what a loaded machine adds to three quick calls (tens of ms)
    host = build_plugin_manager(entry_points=False, timeout_s=1.0)
    release = threading.Event()
    claimer = Claimer(host.call)
    rules = [
        live("before", ByName({"c"}, True)),
        live("hangs", Sleepy(release), "sleepy"),
        live("after", ByName({"a"}, False)),
    ]
    try:
        pids, faults = claimer.claim(rules, TABLE)
        assert faults["hangs"] == ["matchers/sleepy (hangs): no answer within 1s"]
        assert pids == {"before": frozenset({13}), "hangs": frozenset(), "after": frozenset({10, 12})}

        started = time.monotonic()  # while it still hangs: the others are matched one call each, at once
        pids, faults = claimer.claim(rules, TABLE)
        assert time.monotonic() - started < 0.5  # not the 1 s a call waits for an answer
        assert faults["hangs"] == ["matchers/sleepy (hangs): no answer within 1s, and that call is still running"]
        assert pids["before"] == frozenset({13}) and pids["after"] == frozenset({10, 12})
        assert faults["before"] == faults["after"] == []
    finally:
        release.set()

    def claimed_again() -> Claims | None:
        pids, faults = claimer.claim(rules, TABLE)
        return None if faults["hangs"] else (pids, faults)

    # it returned: one call again, and its rule claims what it chose
    pids, faults = wait_until(claimed_again, 10, "the matcher that hung to answer again", poll_s=0.05)
    assert faults == {"before": [], "hangs": [], "after": []}
    assert pids == {"before": frozenset({13}), "hangs": frozenset({10, 11, 12, 14}), "after": frozenset()}
    host.close()
