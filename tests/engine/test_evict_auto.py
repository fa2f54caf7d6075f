"""``evict_after_s: auto``: the wait before an eviction chosen from how long the protecting
rule's latest protections held fleet work, against what an eviction costs.  A fake clock
(``now`` is a number)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from arbiter.engine import codes
from arbiter.engine.evict import SPANS_KEPT, auto_wait, record, step
from arbiter.engine.types import Decision, EngineState, JobVerdict, Reason, RuleState

from .test_evict import POLICY, job, run, trainer

AUTO = replace(POLICY, evict_after_s="auto", evict_cost_s=5.0, release_after_s=0.0)


def protected(state: EngineState, start: float, end: float) -> Decision:
    """The trainer on the GPU from ``start`` to ``end``, no fleet work on the node."""
    d = run(trainer(), [], state, now=start, policy=AUTO)
    return run(trainer(0.0), [], d.state, now=end, policy=AUTO)


def test_a_rule_keeps_how_long_its_latest_protections_held_fleet_work() -> None:
    d = run(trainer(0.0), [], now=0.0, policy=AUTO)
    d = protected(d.state, 10.0, 40.0)
    d = protected(d.state, 50.0, 52.5)
    assert d.state.rules["trainer"].held_spans == (30.0, 2.5)
    assert d.state.rules["trainer"].holding_since is None
    rs = RuleState()
    for i in range(SPANS_KEPT + 3):
        rs = record(record(rs, True, 10.0 * i), False, 10.0 * i + i)
    assert len(rs.held_spans) == SPANS_KEPT and rs.held_spans[-1] == SPANS_KEPT + 2  # the latest kept


def test_with_no_protection_ended_yet_it_waits_as_long_as_an_eviction_costs() -> None:
    d = run(trainer(0.0), [job()], now=0.0, policy=AUTO)
    d = run(trainer(), [job()], d.state, now=1.0, policy=AUTO)
    held = d.state.held["j1"]
    assert d.jobs["j1"].state == "paused" and held.after_s == 5.0
    assert "no protection by 'trainer' has ended here yet" in held.basis
    assert run(trainer(), [job()], d.state, now=5.9, policy=AUTO).jobs["j1"].state == "paused"
    d = run(trainer(), [job()], d.state, now=6.0, policy=AUTO)
    (why,) = d.jobs["j1"].reasons
    assert d.jobs["j1"].state == "stopping" and why.code == codes.JOB_EVICTED
    assert "past evict_after_s (auto: 5s, because no protection by 'trainer'" in why.message
    assert why.evidence["evict_after_s"] == 5.0 and "evict_basis" in why.evidence


def test_where_protection_outlasts_an_eviction_a_paused_job_is_evicted_at_once() -> None:
    d = run(trainer(0.0), [], now=0.0, policy=AUTO)
    for start in (10.0, 100.0, 200.0):
        d = protected(d.state, start, start + 40.0)
    d = run(trainer(0.0), [job()], d.state, now=299.0, policy=AUTO)
    assert d.jobs["j1"].state == "run"
    d = run(trainer(), [job()], d.state, now=300.0, policy=AUTO)
    v = d.jobs["j1"]
    assert v.state == "stopping" and v.reasons[0].code == codes.JOB_EVICTED
    assert "evicted at once" in v.reasons[0].message and "40s at the median" in v.reasons[0].message
    # never stopped, so nothing to continue: told to stop, then ended (requeued by its scheduler)
    assert [a.op for a in d.actions] == ["control", "terminate"]


def test_where_protection_is_short_the_job_waits_it_out() -> None:
    d = run(trainer(0.0), [], now=0.0, policy=AUTO)
    for start in (10.0, 20.0, 30.0):
        d = protected(d.state, start, start + 2.0)
    d = run(trainer(0.0), [job()], d.state, now=99.0, policy=AUTO)
    d = run(trainer(), [job()], d.state, now=100.0, policy=AUTO)
    held = d.state.held["j1"]
    assert d.jobs["j1"].state == "paused" and held.after_s == 2.0
    assert "waiting the longest of them loses least, so it waits 2s" in held.basis
    d = run(trainer(0.0), [job()], d.state, now=101.5, policy=AUTO)
    assert d.jobs["j1"].state == "run"  # protection ended first: nothing was thrown away
    # the long one is counted too: the next choice weighs it
    assert d.state.rules["trainer"].held_spans == (2.0, 2.0, 2.0, 1.5)


@pytest.mark.parametrize(
    ("spans", "cost", "wait"),
    [
        ((), 5.0, 5.0),  # nothing known: the cost itself
        ((40.0,), 5.0, 0.0),  # longer than the cost: at once
        ((1.0, 2.0, 3.0), 5.0, 3.0),  # all shorter: wait the longest out
        ((2.0, 2.0, 2.0, 60.0), 5.0, 2.0),  # mostly short, one long: wait the short ones out, then evict
        ((5.0,), 5.0, 5.0),  # a tie waits: a requeue gains nothing
    ],
)
def test_the_wait_is_the_one_that_loses_least_over_the_rules_protections(
    spans: tuple[float, ...], cost: float, wait: float
) -> None:
    assert auto_wait("trainer", spans, cost)[0] == wait


def test_a_fixed_evict_after_s_is_unchanged_and_says_no_basis() -> None:
    d = run(trainer(0.0), [], now=0.0, policy=POLICY)
    d = protected(d.state, 1.0, 100.0)  # history kept, not used
    d = run(trainer(), [job()], d.state, now=200.0, policy=POLICY)
    held = d.state.held["j1"]
    assert held.after_s == 60.0 and held.basis == ""


def test_a_pause_for_a_tenants_vram_weighs_that_tenants_protections() -> None:
    vram = Reason(codes.JOB_PAUSED_FOR_VRAM, "paused for 'llm'", "", {"tenant": "llm"})
    verdict = JobVerdict("j1", "paused", reasons=(vram,))
    started = job()
    held = step(started, verdict, None, "auto", 100.0, {"llm": (600.0,) * 3}, 5.0)
    assert held is not None and held.evicted_at is not None  # llm's protections outlast an eviction
    assert "by 'llm'" in held.basis
    held = step(started, verdict, None, "auto", 100.0, {}, 5.0)
    assert held is not None and held.after_s == 5.0 and "no protection by 'llm'" in held.basis
