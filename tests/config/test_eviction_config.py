"""A rule's ``eviction:`` settings (how the jobs its protection evicts save their work) are
judged where the rule is: a signal that is not one is refused at its line, with the nearest
signal's name, and a time out of range says its bounds."""

from __future__ import annotations

from collections.abc import Callable

from arbiter.config.errors import ConfigError
from arbiter.config.loader import parse_node_config

BASE = "id: t\nmatch: {name: [x]}\npause_fleet: {scope: gpu}\n"


Problems = Callable[[str], list[str]]


def test_a_rules_eviction_settings_take_a_signal_and_a_bounded_time(rule_problems: Problems) -> None:
    for good in ("USR1", "SIGUSR2", "B:USR1", "B:SIGTERM", "usr1", "10"):
        assert rule_problems(BASE + f"eviction: {{checkpoint_signal: '{good}', checkpoint_s: 30}}\n") == [], good
    assert rule_problems(BASE + "eviction: {checkpoint_s: 0}\n") == []


def test_a_signal_that_is_not_one_is_refused_at_its_line_with_the_nearest(rule_problems: Problems) -> None:
    (said,) = rule_problems(BASE + "eviction:\n  checkpoint_signal: B:UST1\n")
    assert "t.yaml:5" in said and "eviction.checkpoint_signal" in said, said
    assert "'UST1' is not a signal name" in said and "did you mean USR1" in said, said
    (said,) = rule_problems(BASE + "eviction: {checkpoint_signal: 'X:USR1'}\n")
    assert "only B (the batch shell) or R" in said, said


def test_a_checkpoint_time_out_of_range_and_a_misspelt_key_are_refused(rule_problems: Problems) -> None:
    (said,) = rule_problems(BASE + "eviction: {checkpoint_s: -1}\n")
    assert "checkpoint_s" in said and "greater than or equal to 0" in said, said
    (said,) = rule_problems(BASE + "eviction: {checkpoint_s: 601}\n")
    assert "less than or equal to 600" in said, said
    (said,) = rule_problems(BASE + "eviction: {checkpoint_sig: USR1}\n")
    assert "checkpoint_sig" in said and "checkpoint_signal" in said, said


def test_evict_after_s_takes_seconds_auto_or_null_and_says_one_clear_error() -> None:
    for good, value in (("auto", "auto"), ("0", 0.0), ("900", 900.0), ("null", None)):
        assert parse_node_config(f"evict_after_s: {good}\n", "arbiter.yaml").evict_after_s == value
    assert parse_node_config("evict_cost_s: 3\n", "arbiter.yaml").evict_cost_s == 3.0
    for bad, said in (("autp", "'autp' is not a number of seconds; did you mean 'auto'?"), ("-2", "-2 is negative")):
        try:
            parse_node_config(f"evict_after_s: {bad}\n", "arbiter.yaml")
        except ConfigError as exc:
            (problem,) = exc.problems
            assert "arbiter.yaml:1" in str(problem) and said in str(problem), problem
        else:
            raise AssertionError(f"{bad} accepted")
