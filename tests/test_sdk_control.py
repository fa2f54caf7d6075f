"""The job side of the wire protocol, with a real control document and a real nudge."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import arbiter.sdk.control as control_module
from arbiter.config.jobdocs import ControlDocument, JobEvent
from arbiter.sdk.control import NUDGE_SIGNAL, Control, Stopped, write_control_document


def test_without_arbiter_a_job_runs_at_duty_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARBITER_CONTROL", raising=False)
    ctl = Control()
    ctl.safe_point()
    assert (ctl.state, ctl.gpu_duty) == ("run", 1.0)


def test_documents_match_the_published_schema(tmp_path: Path) -> None:
    path = tmp_path / "control.json"
    write_control_document(str(path), "paused", 0.25, 7, "phase on")
    ControlDocument.model_validate(json.loads(path.read_text()))
    events = tmp_path / "events.jsonl"
    ctl = Control(str(path), str(events), install_handler=False)
    ctl.phase("warmup")
    ctl.progress(3, 10)
    ctl.acknowledge_stop()
    for line in events.read_text().splitlines():
        JobEvent.model_validate_json(line)


def test_safe_point_blocks_while_paused_and_wakes_on_the_nudge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a poll far longer than the test may wait: only the nudge can wake it in time
    monkeypatch.setattr(control_module, "_POLL_S", 60.0)
    path = tmp_path / "control.json"
    write_control_document(str(path), "paused", 0.0, 1)
    ctl = Control(str(path))
    released = threading.Event()

    def job() -> None:
        ctl.safe_point()
        released.set()

    t = threading.Thread(target=job, daemon=True)
    t.start()
    # nothing marks "still blocked": a generous window to see it not pass while paused
    assert not released.wait(0.5)
    write_control_document(str(path), "run", 1.0, 2)
    os.kill(os.getpid(), NUDGE_SIGNAL)
    assert released.wait(30)  # the nudge, not the 60 s poll, woke it
    t.join(10)


def test_stop_raises_and_older_documents_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "control.json"
    write_control_document(str(path), "run", 1.0, 5)
    ctl = Control(str(path), install_handler=False)
    write_control_document(str(path), "stop", 0.0, 4, "stale")
    ctl.safe_point()  # seq 4 < 5: ignored
    write_control_document(str(path), "stop", 0.0, 6, "owner asked")
    with pytest.raises(Stopped, match="owner asked"):
        ctl.safe_point()


def test_invalid_state_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_control_document(str(tmp_path / "c"), "sleep", 1.0, 1)


NUDGED_WAITER = """
import sys
from arbiter.sdk.control import Control, write_control_document
write_control_document(sys.argv[1], "paused", 1.0, 1)
ctl = Control(sys.argv[1])
print("ready", flush=True)
while ctl.state == "paused":
    ctl.wait(0.0002)
print("done", flush=True)
"""
NUDGES = 2000


def test_a_nudge_at_any_moment_never_hangs_the_job(tmp_path: Path) -> None:
    # the nudge handler once set a threading.Event: a nudge landing while the job's own wait
    # held that Event's lock deadlocked the job for good (paused, it never saw its resume)
    path = tmp_path / "control.json"
    child = subprocess.Popen([sys.executable, "-c", NUDGED_WAITER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        for _ in range(NUDGES):  # a count, not a time: a loaded machine sends them as fast as it can
            os.kill(child.pid, NUDGE_SIGNAL)
            time.sleep(0.0001)  # spaced out, to land at every moment of its waits
        assert child.poll() is None  # still paused
        write_control_document(str(path), "run", 1.0, 2)  # its resume: seen by a job that still waits
        out, _ = child.communicate(timeout=30)
        assert out.strip() == "done"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
