"""The load bench (bench/load.py) in small: processes, rules, jobs and a JSONL writer on a
real daemon, the fast path measured bare and under load, and every figure printed beside
its goal (no timing is asserted: the box is shared)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    # bench/ is not a package; load the script by its path, as pytest's importlib mode would
    spec = importlib.util.spec_from_file_location("load_bench", ROOT / "bench" / "load.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_a_small_load_runs_and_prints_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _load()
    rc = bench.main(
        [
            "--processes",
            "50",
            "--rules",
            "5",
            "--jobs",
            "3",
            "--lines",
            "500",
            "--seconds",
            "6",
            "--changes",
            "6",
            "--tick",
            "0.25",
        ]
    )
    out = capsys.readouterr().out
    print(out)
    assert rc == 0
    assert re.search(r"load: \d+ processes on the host, 7 rules, 4 jobs", out), (
        out
    )  # 5 + the two measured rules; 3 + the probe
    for figure in (
        "tick CPU per tick",
        "goal < 50 ms",
        "daemon RSS",
        "goal < 100 MiB",
        "JSONL writer",
        "counted rate",
        "lag",
        "fast path, write -> job stopped/continued: bare p50",
        "under load p50",
        "goal: unchanged (within",
        "fast path, the daemon's part",
        "95 % bootstrap interval",
        "the floor",
        "more signals after each",
        "all four samples resampled",
        "plugin failures",
        "fast-path thread decide: ",
    ):
        assert figure in out, f"{figure!r} not printed"
    written = float(re.search(r"JSONL writer: (\d+) lines/s", out).group(1))  # type: ignore[union-attr]
    counted = float(re.search(r"counted rate .*?: mean (\d+) lines/s", out).group(1))  # type: ignore[union-attr]
    assert written > 0 and counted > 0  # the daemon counted the writer's lines


def test_the_fast_path_goal_is_met_only_when_the_whole_interval_of_the_p99s_change_is_within_it() -> None:
    bench = _load()
    goal = bench.GOAL_FAST_MS
    assert bench.fast_verdict(-1.0, goal) == "ok"
    assert bench.fast_verdict(goal + 0.01, goal + 2) == "OVER"
    assert bench.fast_verdict(-1.0, goal + 0.01).startswith("UNDECIDED")  # one draw of it may have been within
