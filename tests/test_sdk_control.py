"""The job side of the wire protocol, with a real control document and a real nudge."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from arbiter.config.models import ControlDocument, JobEvent
from arbiter.sdk.control import NUDGE_SIGNAL, Control, Stopped, write_control_document


def test_without_arbiter_a_job_runs_at_duty_one(monkeypatch) -> None:
    monkeypatch.delenv("ARBITER_CONTROL", raising=False)
    ctl = Control()
    ctl.safe_point()
    assert (ctl.state, ctl.gpu_duty) == ("run", 1.0)


def test_documents_match_the_published_schema(tmp_path) -> None:
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


def test_safe_point_blocks_while_paused_and_wakes_on_the_nudge(tmp_path) -> None:
    path = tmp_path / "control.json"
    write_control_document(str(path), "paused", 0.0, 1)
    ctl = Control(str(path))
    released = threading.Event()

    def job() -> None:
        ctl.safe_point()
        released.set()

    t = threading.Thread(target=job)
    t.start()
    assert not released.wait(0.3)
    write_control_document(str(path), "run", 1.0, 2)
    started = time.monotonic()
    os.kill(os.getpid(), NUDGE_SIGNAL)
    assert released.wait(2)
    assert time.monotonic() - started < 0.2  # the nudge, not the poll, woke it
    t.join()


def test_stop_raises_and_older_documents_are_ignored(tmp_path) -> None:
    path = tmp_path / "control.json"
    write_control_document(str(path), "run", 1.0, 5)
    ctl = Control(str(path), install_handler=False)
    write_control_document(str(path), "stop", 0.0, 4, "stale")
    ctl.safe_point()  # seq 4 < 5: ignored
    write_control_document(str(path), "stop", 0.0, 6, "owner asked")
    with pytest.raises(Stopped, match="owner asked"):
        ctl.safe_point()


def test_invalid_state_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError):
        write_control_document(str(tmp_path / "c"), "sleep", 1.0, 1)


NUDGED_WAITER = """
import sys, time
from arbiter.sdk.control import Control, write_control_document
write_control_document(sys.argv[1], "paused", 1.0, 1)
ctl = Control(sys.argv[1])
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    ctl.wait(0.0002)
print("done", flush=True)
"""


def test_a_nudge_at_any_moment_never_hangs_the_job(tmp_path) -> None:
    # the nudge handler once set a threading.Event: a nudge landing while the job's own wait
    # held that Event's lock deadlocked the job for good (paused, it never saw its resume)
    child = subprocess.Popen(
        [sys.executable, "-c", NUDGED_WAITER, str(tmp_path / "control.json"), "3"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        sent = 0
        end = time.monotonic() + 2.5
        while time.monotonic() < end and child.poll() is None:
            os.kill(child.pid, NUDGE_SIGNAL)
            sent += 1
            time.sleep(0.0001)
        out, _ = child.communicate(timeout=10)
        assert out.strip() == "done" and sent > 1000
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
