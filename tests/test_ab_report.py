"""What `arbiter ab show` prints about the analysis: the interval the verdict used, why, the
paired t-interval beside it, and that the pilot sized the run but is not in R."""

from __future__ import annotations

from dataclasses import replace

from arbiter.engine.abrun import BlockDone, RunSpec, RunState, start, summary, to_record
from arbiter.harness.report import report, text

#: the ON/OFF ratio creeps up across blocks: a program that drifts
SWING = tuple(0.985 + 0.001 * i + (0.0003 if i % 3 == 0 else 0.0) for i in range(14))


def drifting_run(pilot: int = 4) -> RunState:
    rs = start(RunSpec("ab-1", "frames", blocks=len(SWING), pilot=pilot), 0.0)
    blocks = tuple(
        BlockDone(i, i % 2 == 0, round(1000 * r), 10.0, 1000, 10.0, 0.5, float(i)) for i, r in enumerate(SWING)
    )
    return replace(rs, blocks=blocks)


def test_the_report_names_the_interval_used_and_why() -> None:
    rs = drifting_run()
    a = summary(rs).analysis
    assert a is not None and a["pilot"] == 4 and a["n"] == len(SWING) - 4 and a["method"] == "drift-robust"
    shown = text(report(to_record(rs)))
    assert "drift-robust: the interval assumes a lag-1 autocorrelation" in shown
    assert f"paired t-interval {a['t_low']:.4f}–{a['t_high']:.4f}" in shown
    assert "the first 4 blocks (the pilot) sized the run and are not in R" in shown
    assert "the program drifts, and the interval is" in shown  # the lag-1 note says what it cost
    (first, last) = a["ends"]  # the run's ends, which a certificate vouches for too
    assert f"the effect over the first 4 blocks: R = {first[0]:.4f} (lower bound {first[1]:.4f})" in shown
    assert f"over the last 4: R = {last[0]:.4f} ({last[1]:.4f})" in shown


def test_no_analysis_until_two_blocks_after_the_pilot() -> None:
    rs = drifting_run()
    assert summary(replace(rs, blocks=rs.blocks[:5])).analysis is None
    assert summary(replace(rs, blocks=rs.blocks[:6])).analysis is not None
    no_pilot = drifting_run(pilot=0)  # a pilot under 2 blocks sizes nothing and leaves nothing out
    analysis = summary(replace(no_pilot, blocks=no_pilot.blocks[:2])).analysis
    assert analysis is not None and analysis["pilot"] == 0
