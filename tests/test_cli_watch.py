"""`status --watch` and `timeline --follow` keep the view current, and in a file print only
what is new."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from arbiter.cli.render import console
from arbiter.cli.watch import follow_timeline, watch_status
from arbiter_testing.answers import job_answer, rule_answer, status_answer


def sleeps(rounds: int) -> Any:
    """A sleep that ends the loop (as Ctrl-C does) after ``rounds`` waits."""
    count = {"n": 0}

    def sleep(_s: float) -> None:
        count["n"] += 1
        if count["n"] > rounds:
            raise KeyboardInterrupt

    return sleep


def entry(i: int, code: str = "JOB_ADMITTED") -> dict[str, Any]:
    return {"id": i, "t": 1_700_000_000 + i, "code": code, "subject": f"job-{i}", "message": f"the {i}th [x]"}


def test_follow_prints_each_new_entry_once() -> None:
    answers = iter([[entry(1), entry(2)], [entry(1), entry(2)], [entry(2), entry(3)], [entry(3), entry(4, "X")]])
    out = io.StringIO()
    follow_timeline(lambda: next(answers), console(file=out), as_json=False, sleep=sleeps(3))
    text = out.getvalue()
    for i in (1, 2, 3, 4):
        assert text.count(f"the {i}th [x]") == 1, text
    assert "JOB_ADMITTED job-3: the 3th [x]" in text and "X job-4: the 4th [x]" in text


def test_follow_in_json_prints_json_lines(capsys: pytest.CaptureFixture[str]) -> None:
    answers = iter([[entry(1)], [entry(1), entry(2)]])
    follow_timeline(lambda: next(answers), console(file=io.StringIO()), as_json=True, sleep=sleeps(1))
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["id"] for line in lines] == [1, 2]


def status(state: str, share: float) -> dict[str, Any]:
    trainer = rule_answer("trainer", priority=50, running=True, gpu_share=share, using_gpu=state == "held", pids=[1])
    return status_answer(
        uptime_s=5.0,
        reader={"name": "nvml", "why": ""},
        processes=3,
        rules=[trainer],
        jobs=[job_answer("j1", state, pids=[2])],
    )


def test_watch_into_a_file_prints_a_status_when_it_changes() -> None:
    answers = iter([status("run", 0.01), status("run", 0.02), status("held", 0.5), status("held", 0.6)])
    out = io.StringIO()
    watch_status(lambda: next(answers), console(file=out), as_json=False, sleep=sleeps(3))
    text = out.getvalue()
    assert text.count("Tenants") == 2  # run, then held: a share that moved is not a change
    assert "held" in text


def test_watch_on_a_terminal_redraws_in_place() -> None:
    answers = iter([status("run", 0.01), status("held", 0.5), status("held", 0.5)])
    out = io.StringIO()
    con = console(file=out, force_terminal=True, width=160, color_system=None)
    watch_status(lambda: next(answers), con, as_json=False, sleep=sleeps(2))
    assert "held" in out.getvalue() and "\x1b[" in out.getvalue()  # cursor moves: drawn over
