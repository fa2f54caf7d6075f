"""The reflex process's host in this process, with a real JSONL file, the signal translator and
a real job: between a phase line and the first signal it does only what the signal needs, and
it tells the daemon only once the job it paused first has had its moment to stop."""

from __future__ import annotations

import io
import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from arbiter.plugin import JobTarget, ProcessRef
from arbiter.reflex.process import ReflexHost
from arbiter.reflex.wire import Arm, Moves, Setup, SourceSpec, arm_key
from arbiter_testing.waiting import wait_until

SLOT = ("protected", 0, 1)


class Lines(io.StringIO):
    """The host's lines to the daemon, each with what had happened when it was written."""

    def __init__(self, happened: list[str]) -> None:
        super().__init__()
        self.happened = happened
        self.written: list[tuple[str, list[str]]] = []
        self.did = threading.Event()

    def write(self, text: str) -> int:
        self.written.append((text, list(self.happened)))
        if '"did"' in text:
            self.did.set()
        return super().write(text)


@pytest.fixture
def job() -> Iterator[psutil.Process]:
    proc = subprocess.Popen(["sleep", "60"])
    yield psutil.Process(proc.pid)
    proc.kill()
    proc.wait()


def host_for(tmp_path: Path, out: Lines) -> ReflexHost:
    setup = Setup(
        plugins=[],
        disable=[],
        only=["sources", "translators"],
        timeout_s=5.0,
        state_dir=str(tmp_path),
        stand_in_gpu=True,
        sections={},
        translator="signal",
        journal=str(tmp_path / "paused.journal"),
        lock=str(tmp_path / "reflex.lock"),
    )
    return ReflexHost(setup, out)


def test_a_pause_is_told_after_the_first_job_had_its_moment_to_stop(tmp_path: Path, job: psutil.Process) -> None:
    phases = tmp_path / "phases.jsonl"
    phases.write_text(json.dumps({"event": "status", "phase": "off"}) + "\n")
    happened: list[str] = []
    out = Lines(happened)
    host = host_for(tmp_path, out)
    first = JobTarget("j1", "job", (ProcessRef(job.pid, job.create_time()),))
    settle = host.actuator.settle

    def settled(target: JobTarget, since: float) -> None:
        settle(target, since)
        happened.append(f"settled {target.job_id}")

    host.actuator.settle = settled  # type: ignore[method-assign]
    try:
        host.take(Arm(1, {arm_key(*SLOT): {"on": Moves((first,)), "off": Moves()}}))
        source = {"path": str(phases), "event": "status", "field": "phase", "on": ["on"]}
        host.sync((SourceSpec(*SLOT, "jsonl", source),))
        with open(phases, "a") as fh:
            fh.write(json.dumps({"event": "status", "phase": "on"}) + "\n")
        assert out.did.wait(10), out.getvalue()
        told = [then for text, then in out.written if '"did"' in text]
        # the line that wakes the daemon comes after the wait for the job to stop, not before
        assert told == [["settled j1"]]
        # its moment is a millisecond: on a busy host the stop it was sent comes after that
        wait_until(lambda: job.status() == psutil.STATUS_STOPPED, 10, "the job stopped")
    finally:
        host.sync(())
