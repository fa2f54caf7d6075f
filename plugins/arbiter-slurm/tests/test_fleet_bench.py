"""The fleet bench (bench/fleet.py) in small, against real Slurm: every figure is printed,
with how often a job process was free to run while its node's protected phase was on (a
figure, judged in the bench's output: it names each such process and when), the requeue, and
the fleet's throughput against the oracle's with eviction off and on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from arbiter_testing.needs import need
from arbiter_testing.scripts import load_script
from arbiter_testing.slurm import unavailable

ROOT = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.slow, pytest.mark.bench, pytest.mark.timeout(300)]


def test_two_rounds_print_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    need("slurm", unavailable())
    bench = load_script(ROOT / "bench" / "fleet.py", "fleet")
    args = ["--nodes", "2", "--jobs", "1", "--rounds", "2", "--seed", "3"]
    args += ["--throughput-s", "12", "--work-s", "3", "--free-s", "4", "--busy-s", "4", "--evict-after-s", "2"]
    rc = bench.main(args)
    out = capsys.readouterr().out
    print(out)
    assert rc == 0, out
    for figure in ("stopped (local): p50", "S in squeue: p50", "R in squeue: p50", "requeued job running again: p50"):
        assert figure in out, out
    assert "with the phase on and a job process of its node not stopped:" in out, out
    assert "the oracle does" in out, out
    for tag in ("evict_after_s off: ", "evict_after_s 2 s: "):
        assert re.search(tag + r"\d+ s of work \(\d+% of the oracle's\), \d+ jobs \(\d+%\), \d+ requeued", out), out
