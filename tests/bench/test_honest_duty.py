"""bench/honest_duty.py, run small: honest SDK jobs beside a busy core are not struck by any
cpu_time configuration, and a cheater is."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from arbiter_testing.scripts import load_script

pytestmark = pytest.mark.alone

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the reader's child reads /proc")
def test_a_small_run_strikes_no_honest_job_and_the_cheater(capsys: pytest.CaptureFixture[str]) -> None:
    # the lowest and the highest duty, three samples each (as many as a strike needs)
    load_script(ROOT / "bench" / "honest_duty.py", "honest_duty").main(
        ["--duties", "0.1,0.9", "--minutes", "0.2", "--json"]
    )
    summary = json.loads(capsys.readouterr().out)
    honest = [r for r in summary["rows"] if r["job"] == "honest"]
    assert {r["reader"] for r in honest} == {"cpu_time", "cpu_time threads"}
    assert all(r["samples"] >= 3 for r in honest), honest
    assert summary["honest_strikes"] == 0 and all(r["mean"] <= r["asked"] + 0.1 for r in honest), honest
    cheater = [r for r in summary["rows"] if r["job"] == "cheater"]
    assert len(cheater) == 2, cheater
    # it spins, but a box busy with other work may give it no more of a core than it claims
    cheating = [r for r in cheater if r["mean"] > r["asked"] + 0.1]
    if not cheating:
        pytest.skip(f"the box gave the spinning cheater no more than it claims: {cheater}")
    assert all(r["first_strike_sample"] is not None for r in cheating), cheater
