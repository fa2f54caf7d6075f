"""The daemon's link to the reflex process, with a real process, a real JSONL file and a
real job process: it acts on what it was armed with, under the lock both sides signal
under, and tells the daemon what it did, in order."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from arbiter.reflex.link import Gone, ReflexLink
from arbiter.reflex.wire import Arm, Setup, SourceSpec, arm_key, encode, to_process
from arbiter.state.journal import PausedJournal
from arbiter_testing.waiting import wait_until

SPEC = ("r", 0, 1, "jsonl", {"event": "status", "field": "phase", "on": ["busy"]})


class WireLink(ReflexLink):
    """The link as its lines show it: these tests write and read the messages in the shape
    they take on the wire, through the codec both processes use."""

    def sync(self, specs: list[Any]) -> None:
        super().sync([SourceSpec(*spec) for spec in specs])

    def arm(self, arm: dict[str, Any]) -> None:
        message = to_process(json.dumps({"arm": 0, "slots": arm}))
        assert isinstance(message, Arm)
        super().arm(message.slots)

    def take(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return [
            {"gone": m.why}
            if isinstance(m, Gone)
            else {**json.loads(encode(m)), **({"stale": True} if m.stale else {})}
            for m in super().take()
        ]


class Linked:
    def __init__(self, tmp_path: Path) -> None:
        self.events = tmp_path / "events.jsonl"
        self.events.touch()
        self.journal = tmp_path / "paused.journal"
        self.arrived = threading.Event()
        setup: dict[str, Any] = {
            "plugins": [],
            "disable": [],
            "only": ["sources", "translators"],
            "timeout_s": 5.0,
            "state_dir": str(tmp_path),
            "stand_in_gpu": False,
            "translator": "signal",
            "journal": str(self.journal),
        }
        self.link = WireLink(Setup(**setup, sections={}), tmp_path, self.arrived.set)
        self.lines: list[dict[str, Any]] = []
        self.act = threading.RLock()  # the decision thread's turn, which held() is taken in

    def sync(self) -> None:
        self.link.sync([(*SPEC[:4], {**SPEC[4], "path": str(self.events)})])

    def phase(self, value: str) -> None:
        with open(self.events, "a") as fh:
            fh.write(json.dumps({"event": "status", "phase": value}) + "\n")

    def wait_line(self, test: Any, timeout: float = 10.0) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            with self.act:
                self.lines.extend(self.link.take())
            line = next((line for line in self.lines if test(line)), None)
            if line is not None:
                self.lines.remove(line)
            return line

        try:
            return wait_until(found, timeout, "a line from the reflex process", poll_s=0.005)
        except AssertionError:
            raise AssertionError(f"no such line in {self.lines}") from None

    def arm(self, on: list[Any], off: list[Any]) -> None:
        with self.act, self.link.held():
            self.link.arm({arm_key("r", 0, 1): {"on": [on, []], "off": [[], off]}})


@pytest.fixture
def linked(tmp_path: Path) -> Iterator[Linked]:
    made = Linked(tmp_path)
    yield made
    made.link.close()


@pytest.fixture
def job() -> Iterator[psutil.Process]:
    proc = subprocess.Popen(["sleep", "60"])
    yield psutil.Process(proc.pid)
    proc.kill()
    proc.wait()


def stopped(proc: psutil.Process, timeout: float = 10.0) -> bool:
    """Wait until ``proc`` is stopped (True), or fail."""
    return wait_until(
        lambda: proc.status() == psutil.STATUS_STOPPED, timeout, f"pid {proc.pid} to be stopped", poll_s=0.002
    )


def waits_for_lock(pid: int, path: Path) -> bool:
    """Whether ``pid`` is blocked taking ``flock`` on ``path`` (the kernel lists each waiter,
    marked ``->``, in /proc/locks, by pid and the file's device and inode)."""
    st = os.stat(path)
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields and fields[fields.index("->") + 1] == "FLOCK":
            rest = fields[fields.index("->") + 1 :]
            if int(rest[3]) == pid and rest[4] == where:
                return True
    return False


def test_armed_it_pauses_and_resumes_writes_the_journal_first_and_reports_what_it_did(
    linked: Linked, job: psutil.Process
) -> None:
    linked.sync()
    first = linked.wait_line(lambda line: "state" in line)
    assert first["slot"] == ["r", 0, 1] and "armed" not in first  # a first reading is never acted on
    linked.phase("idle")
    linked.wait_line(lambda line: line.get("state", {}).get("phase") == "off")
    entry = ["j", "tree", job.pid, job.create_time(), "signal", None]
    linked.arm([["j", "job", [[job.pid, job.create_time()]]]], [entry])

    linked.phase("busy")
    assert stopped(job)
    line = linked.wait_line(lambda line: "did" in line)
    assert line["armed"] and line["state"]["phase"] == "on"
    assert line["state"]["changed_at"] <= line["locked_at"] <= line["first_at"] <= line["acted_at"]
    assert [op for op, _ in line["did"]] == ["pause"] and [row[2] for row in line["did"][0][1]] == [job.pid]
    assert job.pid in {e.pid for e in PausedJournal.replay(linked.journal).values()}

    linked.phase("idle")
    line = linked.wait_line(lambda line: "did" in line)
    assert [op for op, _ in line["did"]] == ["resume"]
    assert job.status() != psutil.STATUS_STOPPED
    assert not PausedJournal.replay(linked.journal)


def test_the_first_job_is_paused_and_resumed_alone_then_the_others(linked: Linked) -> None:
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    try:
        jobs = [psutil.Process(p.pid) for p in procs]
        linked.sync()
        linked.wait_line(lambda line: "state" in line)
        linked.phase("idle")
        linked.wait_line(lambda line: line.get("state", {}).get("phase") == "off")
        linked.arm([[f"j{i}", f"job{i}", [[j.pid, j.create_time()]]] for i, j in enumerate(jobs)], [])
        linked.phase("busy")
        line = linked.wait_line(lambda line: "did" in line)
        assert [[row[0] for row in rows] for _, rows in line["did"]] == [["j0"], ["j1", "j2"]]
        assert all(stopped(j) for j in jobs)

        linked.arm([], [row for _, rows in reversed(line["did"]) for row in rows])  # j1, j2, then j0
        linked.phase("idle")
        line = linked.wait_line(lambda line: "did" in line)
        assert [op for op, _ in line["did"]] == ["resume", "resume"]
        assert [[row[0] for row in rows] for _, rows in line["did"]] == [["j1"], ["j2", "j0"]]
        assert line["locked_at"] <= line["first_at"] <= line["acted_at"]
        assert all(j.status() != psutil.STATUS_STOPPED for j in jobs)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_it_waits_for_the_lock_and_acts_on_the_arm_given_under_it(linked: Linked, job: psutil.Process) -> None:
    linked.sync()
    linked.wait_line(lambda line: "state" in line)
    linked.phase("idle")
    linked.wait_line(lambda line: line.get("state", {}).get("phase") == "off")
    linked.arm([], [])  # armed with nothing to pause
    with linked.act, linked.link.held():
        linked.phase("busy")
        pid = linked.link.pid
        assert pid is not None
        wait_until(
            lambda: waits_for_lock(pid, Path(linked.link.setup.lock)),
            10,
            "the reflex process to read the change and wait for the lock",
        )
        assert job.status() != psutil.STATUS_STOPPED  # it waits while the daemon acts
        # the daemon's act ends with a new arm: the process acts on this one, not the last
        linked.link.arm(
            {arm_key("r", 0, 1): {"on": [[["j", "job", [[job.pid, job.create_time()]]]], []], "off": [[], []]}}
        )
    assert stopped(job)
    line = linked.wait_line(lambda line: "did" in line)
    assert line["armed"] and [op for op, _ in line["did"]] == ["pause"]


def test_unarmed_it_acts_on_nothing_and_says_so(linked: Linked, job: psutil.Process) -> None:
    linked.sync()
    linked.wait_line(lambda line: "state" in line)
    linked.phase("idle")
    linked.wait_line(lambda line: "state" in line)
    linked.phase("busy")
    line = linked.wait_line(lambda line: line.get("state", {}).get("phase") == "on")
    assert line["armed"] is False and "did" not in line
    assert job.status() != psutil.STATUS_STOPPED


def test_a_source_it_cannot_watch_is_left_to_the_daemon(linked: Linked) -> None:
    linked.link.sync([("r", 0, 1, "no-such-kind", {})])
    line = linked.wait_line(lambda line: line.get("covered") is False)
    assert "no-such-kind" in line["why"] and "state" not in line


def test_a_process_that_cannot_start_says_why(tmp_path: Path) -> None:
    arrived = threading.Event()
    setup: dict[str, Any] = {
        "plugins": [],
        "disable": [],
        "only": ["sources"],
        "timeout_s": 5.0,
        "state_dir": str(tmp_path),
        "stand_in_gpu": False,
        "translator": "signal",
        "journal": str(tmp_path / "j"),
    }
    link = WireLink(Setup(**setup, sections={}), tmp_path, arrived.set)  # the translators' plugin left out
    try:
        link.sync([(*SPEC[:4], {**SPEC[4], "path": str(tmp_path / "e.jsonl")})])
        assert arrived.wait(20)
        wait_until(lambda: link.pid is None, 10, "the link to give the process up")
        assert "the pause translator 'signal' is not installed here" in link.failure
        assert [line for line in link.take() if "gone" in line]
    finally:
        link.close()


def test_a_process_that_dies_is_reported_gone_and_the_lock_is_not_waited_for(linked: Linked) -> None:
    linked.sync()
    linked.wait_line(lambda line: "state" in line)
    pid = linked.link.pid
    assert pid is not None
    psutil.Process(pid).kill()
    gone = linked.wait_line(lambda line: "gone" in line)
    assert "exited" in gone["gone"] and linked.link.pid is None
    with linked.act, linked.link.held():  # nothing holds it: no wait
        pass
    linked.sync()  # not restarted before the retry time
    assert linked.link.pid is None


def test_two_sources_changing_at_once_each_report_what_they_did(linked: Linked, tmp_path: Path) -> None:
    other = tmp_path / "other.jsonl"
    other.touch()
    jobs = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    try:
        procs = [psutil.Process(p.pid) for p in jobs]
        linked.link.sync(
            [
                (*SPEC[:4], {**SPEC[4], "path": str(linked.events)}),
                ("r", 1, 1, "jsonl", {**SPEC[4], "path": str(other)}),
            ]
        )
        for index, path in enumerate((linked.events, other)):
            linked.wait_line(lambda line, i=index: line.get("slot") == ["r", i, 1])
            with open(path, "a") as fh:
                fh.write(json.dumps({"event": "status", "phase": "idle"}) + "\n")
            linked.wait_line(lambda line, i=index: line.get("slot") == ["r", i, 1] and line["state"]["phase"] == "off")
        with linked.act, linked.link.held():
            linked.link.arm(
                {
                    arm_key("r", i, 1): {"on": [[[f"j{i}", "job", [[p.pid, p.create_time()]]]], []], "off": [[], []]}
                    for i, p in enumerate(procs)
                }
            )
        for path in (linked.events, other):  # as close together as two writes come
            with open(path, "a") as fh:
                fh.write(json.dumps({"event": "status", "phase": "busy"}) + "\n")
        assert all(stopped(p) for p in procs)
        for i, p in enumerate(procs):
            line = linked.wait_line(lambda line, i=i: line.get("slot") == ["r", i, 1] and "did" in line)
            assert [[row[0], row[2]] for op, rows in line["did"] for row in rows] == [[f"j{i}", p.pid]]
    finally:
        for job in jobs:
            job.kill()
            job.wait()
