"""The fleet bench (bench/fleet.py) in small, against real Slurm: every figure is printed,
with how often a job process was free to run while its node's protected phase was on (a
figure, judged in the bench's output: it names each such process and when)."""

from __future__ import annotations

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
    # the requeue is tested on its own (test_slurm_jobs.py); here, the phase rounds alone
    rc = bench.main(["--nodes", "2", "--jobs", "1", "--rounds", "2", "--seed", "3", "--no-requeue"])
    out = capsys.readouterr().out
    print(out)
    assert rc == 0, out
    for figure in ("stopped (local): p50", "S in squeue: p50", "R in squeue: p50"):
        assert figure in out, out
    assert "with the phase on and a job process of its node not stopped:" in out, out
