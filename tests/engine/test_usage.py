"""The busy share from two readings and the "uses the GPU" hysteresis."""

from __future__ import annotations

import pytest

from arbiter.engine.types import RuleObs, RuleState
from arbiter.engine.usage import busy_share, gpu_usage

S = 1_000_000_000


def test_share_is_busiest_engine_over_interval() -> None:
    before = {1: {"gfx": 0, "video": 0}, 2: {"gfx": 0}}
    after = {1: {"gfx": S // 4, "video": S // 2}, 2: {"gfx": S // 4}}
    assert busy_share(before, 0, after, S, [1, 2]) == pytest.approx(0.5)


def test_share_ignores_other_pids_and_vanished_ones() -> None:
    assert busy_share({1: {"c": 0}}, 0, {1: {"c": S // 10}, 9: {"c": S}}, S, [1, 3]) == pytest.approx(0.1)


def test_new_process_counts_from_zero_capped_at_interval() -> None:
    assert busy_share({}, 0, {1: {"c": 50 * S}}, S, [1]) == pytest.approx(1.0)


def test_counter_reset_counts_from_zero() -> None:
    assert busy_share({1: {"c": 10 * S}}, 0, {1: {"c": S // 5}}, S, [1]) == pytest.approx(0.2)


def test_counters_handed_back_unchanged_count_nothing_beside_a_busy_process() -> None:
    idle = {"c": 7 * S}  # a reader reuses an idle process's counters: the same object in both
    assert busy_share({1: idle, 2: {"c": 0}}, 0, {1: idle, 2: {"c": S // 4}}, S, [1, 2]) == pytest.approx(0.25)
    assert busy_share({1: idle}, 0, {1: idle}, S, [1]) == 0.0


def test_no_previous_reading_is_unknown() -> None:
    assert busy_share(None, 0, {1: {"c": 1}}, S, [1]) is None
    assert busy_share({}, S, {}, S, [1]) is None


def test_hysteresis_on_above_threshold_off_after_release() -> None:
    obs = RuleObs("r", running=True, gpu_share=0.06)
    s = gpu_usage(RuleState(), obs, 0.05, 10, now=100)
    assert s.using_gpu and s.using_since == 100
    quiet = RuleObs("r", running=True, gpu_share=0.05)  # at the threshold is not above it
    assert gpu_usage(s, quiet, 0.05, 10, now=109.9).using_gpu
    s2 = gpu_usage(s, quiet, 0.05, 10, now=110)
    assert not s2.using_gpu and s2.using_since is None


def test_below_threshold_from_the_start_is_not_using() -> None:
    assert not gpu_usage(RuleState(), RuleObs("r", running=True, gpu_share=0.0), 0.05, 10, 0).using_gpu
