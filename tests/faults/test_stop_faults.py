"""A job that ignores being told to end: stopping it terminates its processes at once (it
cannot read a control document), then kills them once ``stop_grace_s`` has passed, and the
timeline says each step; the protected program beside it is never touched."""

from __future__ import annotations

import textwrap
import time

import psutil

from arbiter_testing.node import PYTHON

from .conftest import Scene

STUBBORN = textwrap.dedent(
    """
    import signal, sys, time
    note = sys.argv[1]
    def ignore(signum, frame):
        with open(note, "a") as fh:
            fh.write(f"{time.monotonic()} {signal.Signals(signum).name}\\n")
    signal.signal(signal.SIGTERM, ignore)
    while True:
        time.sleep(0.05)
    """
)
GRACE_S = 8.0


def test_a_job_that_ignores_terminate_is_killed_after_the_grace_period(scene: Scene) -> None:
    scene.node.config["stop_grace_s"] = GRACE_S
    scene.node.write_config()
    scene.protect()
    scene.start()
    script, note = scene.root / "stubborn.py", scene.root / "stubborn.log"
    script.write_text(STUBBORN)
    launcher = scene.node.job_run([PYTHON, str(script), str(note)], "--name", "stubborn")
    pid = scene.node.job_pid("stubborn", timeout=30)
    job_id = scene.node.known_job("stubborn")["id"]

    asked = time.monotonic()
    scene.node.cli("job", "stop", job_id, check=True)
    scene.node.wait_for(lambda: note.exists() and "SIGTERM" in note.read_text(), timeout=30)
    termed = time.monotonic()
    assert launcher.poll() is None  # it ignored being told to end
    stopping = scene.explained("JOB_STOPPED", "stubborn")
    assert "asked it to stop" in stopping["message"]

    assert launcher.wait(timeout=60) != 0
    ended = time.monotonic()
    assert ended - asked >= GRACE_S, "killed before its grace period was over"
    assert ended - termed < GRACE_S + 30  # and not left running
    steps = scene.node.events("JOB_STOPPED", subject=job_id, contains="killed")
    by_step = {e["data"].get("step"): e for e in steps}
    assert "asked it to stop" in by_step["terminated"]["message"]  # terminated at once: it reads no control document
    assert f"still running {GRACE_S:g}s after it was told to end" in by_step["killed"]["message"]
    assert by_step["terminated"]["id"] < by_step["killed"]["id"]
    assert by_step["killed"]["t"] - by_step["terminated"]["t"] >= GRACE_S - 0.5
    scene.node.events("JOB_EXITED", subject=job_id)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    scene.assert_alive()
    scene.assert_protected_untouched()
