"""A job's events file, read tick by tick: the latest of each report, and bad lines named."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from arbiter.daemon import jobevents
from arbiter.daemon.jobevents import JobEventLog, JobReport
from arbiter.sdk.control import Control


def append(path: Path, *lines: str | dict[str, object]) -> None:
    with open(path, "a") as fh:
        for line in lines:
            fh.write((line if isinstance(line, str) else json.dumps(line)) + "\n")


@pytest.fixture
def events(tmp_path: Path) -> Path:
    path = tmp_path / "events.jsonl"
    path.touch()
    return path


def test_the_latest_phase_progress_duty_and_stop_ack_are_kept(events: Path, tmp_path: Path) -> None:
    log = JobEventLog()
    assert log.read({"j": str(events)})["j"].lines == 0
    ctl = Control(path=str(tmp_path / "no-control.json"), events=str(events), install_handler=False)
    ctl.phase("loading")
    ctl.progress(3, 10)
    append(events, {"t": 5.0, "event": "metric", "name": "gpu_duty", "busy": 0.28, "duty": 0.3, "device": "gpu"})
    report = log.read({"j": str(events)})["j"]
    assert (report.phase, report.done, report.total, report.duty, report.busy, report.device) == (
        "loading",
        3,
        10,
        0.3,
        0.28,
        "gpu",
    )
    assert report.lines == 3 and report.malformed == 0 and report.stop_acked_at is None
    ctl.phase("compute")
    ctl.progress(4, 10)
    append(events, {"t": 6.0, "event": "metric", "name": "loss", "busy": 0.0, "duty": 0.0})  # not the duty metric
    ctl.acknowledge_stop()
    report = log.read({"j": str(events)})["j"]
    assert (report.phase, report.done, report.duty) == ("compute", 4, 0.3)
    assert report.stop_acked_at is not None and report.lines == 7
    shown = report.to_dict()
    assert shown["phase"]["name"] == "compute" and shown["progress"]["total"] == 10 and "problem" not in shown


def test_a_bad_line_is_counted_and_named_by_file_and_line_without_its_content(events: Path) -> None:
    log = JobEventLog()
    append(
        events,
        {"t": 1.0, "event": "phase", "phase": "a"},
        "{not json secret-token",
        "",
        {"t": 2.0, "event": "progress", "done": -1},
        {"t": 3.0, "event": "teleport"},
        "[1, 2]",
        {"t": 4.0, "event": "phase", "phase": "b"},
    )
    report = log.read({"j": str(events)})["j"]
    assert report.phase == "b" and report.lines == 2 and report.malformed == 4
    assert report.problem.startswith(f"{events} line 6: ") and "schema event" in report.problem
    assert "secret-token" not in json.dumps(report.to_dict())
    append(events, {"t": 5.0, "event": "progress", "done": -1})
    assert (
        "line 8: progress.done: Input should be greater than or equal to 0" in log.read({"j": str(events)})["j"].problem
    )


def test_a_line_is_taken_only_once_it_ends_and_an_endless_line_is_skipped(
    events: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jobevents, "MAX_LINE_BYTES", 100)
    log = JobEventLog()
    with open(events, "a") as fh:
        fh.write('{"t": 1.0, "event": "pha')
    assert log.read({"j": str(events)})["j"].lines == 0
    with open(events, "a") as fh:
        fh.write('se", "phase": "warm"}\n' + "x" * 150)
    report = log.read({"j": str(events)})["j"]
    assert report.phase == "warm" and report.malformed == 1 and "line 2: longer than 100 bytes" in report.problem
    with open(events, "a") as fh:
        fh.write("y" * 150)  # still the same line
    assert log.read({"j": str(events)})["j"].malformed == 1
    with open(events, "a") as fh:
        fh.write('zz\n{"t": 2.0, "event": "phase", "phase": "next"}\n')
    report = log.read({"j": str(events)})["j"]
    assert report.phase == "next" and report.malformed == 1 and report.lines == 2
    append(events, "nope")
    assert "line 4:" in log.read({"j": str(events)})["j"].problem


def test_a_truncated_file_is_read_from_its_start(events: Path) -> None:
    log = JobEventLog()
    append(events, *[{"t": float(i), "event": "progress", "done": i} for i in range(20)])
    assert log.read({"j": str(events)})["j"].done == 19
    events.write_text(json.dumps({"t": 30.0, "event": "progress", "done": 1}) + "\n")
    report = log.read({"j": str(events)})["j"]
    assert report.done == 1 and report.lines == 21


def test_a_flood_is_read_a_share_per_tick_and_no_job_starves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobevents, "READ_PER_JOB", 4000)
    monkeypatch.setattr(jobevents, "READ_PER_TICK", 6000)
    flood, quiet = tmp_path / "flood.jsonl", tmp_path / "quiet.jsonl"
    append(flood, *[{"t": float(i), "event": "progress", "done": i} for i in range(2000)])
    append(quiet, {"t": 1.0, "event": "phase", "phase": "quiet"})
    log = JobEventLog()
    paths = {"flood": str(flood), "quiet": str(quiet)}
    first = log.read(paths)
    second = log.read(paths)
    assert first["flood"].behind_bytes > 0 and first["flood"].done is not None
    assert "quiet" in {j for j, r in second.items() if r.phase == "quiet"}  # read within two ticks
    for _ in range(200):
        report = log.read(paths)["flood"]
        if report.behind_bytes == 0:
            break
    assert report.done == 1999 and report.behind_bytes == 0 and report.malformed == 0


def test_a_missing_file_a_link_or_a_directory_is_unreadable_with_why(tmp_path: Path, events: Path) -> None:
    link, folder = tmp_path / "link.jsonl", tmp_path / "dir.jsonl"
    os.symlink(events, link)
    folder.mkdir()
    reports = JobEventLog().read({"gone": str(tmp_path / "none.jsonl"), "link": str(link), "dir": str(folder)})
    assert "does not exist" in reports["gone"].why
    assert "cannot open" in reports["link"].why  # a job's link to another file is never followed
    assert "not a regular file" in reports["dir"].why


def test_jobs_no_longer_named_are_forgotten(events: Path) -> None:
    log = JobEventLog()
    log.read({"a": str(events), "b": str(events)})
    assert set(log.read({"b": str(events)})) == {"b"}


def held(path: Path) -> int:
    """Descriptors this process holds on ``path``."""
    fds = Path("/proc/self/fd")
    count = 0
    for fd in fds.iterdir():
        try:
            count += os.readlink(fd) == str(path)
        except OSError:
            pass
    return count


def test_no_descriptor_is_held_between_reads_and_an_unchanged_file_is_not_opened(events: Path) -> None:
    """One account may register hundreds of jobs: a descriptor kept per job would spend the
    daemon's descriptors for it."""
    log = JobEventLog()
    append(events, {"t": 1.0, "event": "phase", "phase": "p"})
    assert log.read({"j": str(events)})["j"].phase == "p"
    assert held(events) == 0
    fifo = events.with_name("fifo")
    os.mkfifo(fifo)  # size 0, nothing to read: never opened (an open of some files has side effects)
    assert log.read({"j": str(events), "f": str(fifo)})["f"] == JobReport()
    append(events, {"t": 2.0, "event": "phase", "phase": "q"})
    assert log.read({"j": str(events)})["j"].phase == "q" and held(events) == 0


def test_an_unchanged_file_keeps_its_report_as_it_was(events: Path) -> None:
    # fifty jobs' files looked at every tick, each report made anew though nothing changed,
    # was a share of what the tick cost
    log = JobEventLog()
    append(events, {"t": 1.0, "event": "phase", "phase": "a"})
    first = log.read({"j": str(events)})["j"]
    assert first.lines == 1
    assert log.read({"j": str(events)})["j"] is first
    append(events, {"t": 2.0, "event": "phase", "phase": "b"})
    assert log.read({"j": str(events)})["j"].lines == 2


def test_only_json_white_space_is_taken_off_a_line(events: Path) -> None:
    with open(events, "ab") as fh:
        fh.write(b'\t{"t": 1.0, "event": "phase", "phase": "a"} \r\n\x0c{"t": 2.0, "event": "phase", "phase": "b"}\n')
    report = JobEventLog().read({"j": str(events)})["j"]
    assert report.phase == "a" and report.malformed == 1  # a form feed is no JSON white space


@pytest.mark.parametrize(
    "phase",
    ["[link=https://evil.example]click[/link]" + "x" * 64, "\x1b]8;;https://evil.example\x07here", "two\nlines", ""],
)
def test_what_a_job_says_of_itself_is_short_and_has_no_control_characters(events: Path, phase: str) -> None:
    """Status is every account's to read: a job's phase is at most 64 characters on one line,
    with no terminal escape; anything else is a malformed line, named, never shown."""
    with open(events, "a") as fh:
        fh.write(json.dumps({"t": 1.0, "event": "phase", "phase": phase}) + "\n")
    report = JobEventLog().read({"j": str(events)})["j"]
    assert report.phase is None and report.malformed == 1 and (not phase or phase not in report.problem)
