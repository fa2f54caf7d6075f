"""The wall clock jumps forward and back under a running daemon.

Setting the machine's clock would disturb everything else on it, so the jump is made in the
daemon process alone: a ``sitecustomize`` module on its PYTHONPATH shifts ``time.time`` (and
``time_ns``) by the seconds a file holds, read as the daemon runs.  Decisions run on the
monotonic clock: a jump releases no held work, does not stretch or skip a stop's grace
period, crashes nothing, and is named (CLOCK_JUMPED on the timeline and in ``explain``)."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path
from typing import Any

import psutil

from arbiter.config.jobdocs import Manifest
from arbiter.daemon.jobs import JobRegistry
from arbiter.state.certificates import Certificate, status
from arbiter_testing.node import PYTHON

from .conftest import Scene

DAY = 24 * 3600.0
SHIFT = textwrap.dedent(
    """
    import os
    import time


    def _shift_wall_clock() -> None:
        path = os.environ.get("ARBITER_TEST_WALL_OFFSET_FILE")
        if not path:
            return
        real_time, real_time_ns, monotonic = time.time, time.time_ns, time.monotonic
        cache = [-1.0, 0.0]  # when the file was last read, the offset it held

        def offset() -> float:
            now = monotonic()
            if now - cache[0] > 0.05:
                cache[0] = now
                try:
                    with open(path) as fh:
                        cache[1] = float(fh.read().strip() or 0)
                except (OSError, ValueError):
                    pass
            return cache[1]

        time.time = lambda: real_time() + offset()
        time.time_ns = lambda: real_time_ns() + int(offset() * 1e9)


    _shift_wall_clock()
    """
)


def shifted(scene: Scene) -> Path:
    """Start the scene's daemon with its wall clock shiftable; the offset file."""
    site = scene.root / "clock-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SHIFT)
    offset = scene.root / "wall-offset"
    offset.write_text("0")
    scene.protect()
    scene.start(PYTHONPATH=str(site), ARBITER_TEST_WALL_OFFSET_FILE=str(offset))
    assert abs(scene.node.status()["uptime_s"]) < 3600  # not shifted yet
    return offset


def jump(scene: Scene, offset: Path, seconds: float, way: str) -> None:
    offset.write_text(str(seconds))
    scene.node.events("CLOCK_JUMPED", contains=f"jumped {way}")


def test_held_and_paused_work_stays_so_when_the_wall_clock_jumps(scene: Scene) -> None:
    offset = shifted(scene)
    pid = scene.run_job("fleet")
    scene.gpu(0.8)  # the protected program works: the job is paused, a new one waits
    scene.held("fleet", "PROTECTED_GPU_BUSY")
    late = scene.node.job_run([PYTHON, "-c", "pass"], "--name", "late")
    scene.held("late", "PROTECTED_GPU_BUSY")

    for seconds, way in ((30 * DAY, "forward"), (-30 * DAY, "back")):
        jump(scene, offset, seconds, way)
        scene.ticks(4)
        assert (
            scene.node.known_job("fleet")["state"] == "paused" and psutil.Process(pid).status() == psutil.STATUS_STOPPED
        )
        assert scene.node.known_job("late")["state"] == "held" and late.poll() is None
        notice = scene.explained("CLOCK_JUMPED")
        assert f"jumped {way}" in notice["message"] and "monotonic" in notice["message"]
        scene.assert_alive()
        scene.assert_protected_untouched()

    scene.gpu(0.0)  # the program stops: both run, at once, whatever the clock says
    assert late.wait(timeout=60) == 0
    scene.node.wait_for(lambda: scene.node.known_job("fleet")["state"] == "run", timeout=30)
    scene.assert_protected_untouched()


STUBBORN = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    time.sleep(0.05)\n"
GRACE_S = 4.0


def test_a_clock_set_back_during_a_stop_does_not_stretch_its_grace_period(scene: Scene) -> None:
    scene.node.config["stop_grace_s"] = GRACE_S
    scene.node.write_config()
    offset = shifted(scene)
    launcher = scene.node.job_run([PYTHON, "-c", STUBBORN], "--name", "stubborn")
    scene.node.job_pid("stubborn", timeout=30)
    job_id = scene.node.known_job("stubborn")["id"]
    asked = time.monotonic()
    scene.node.cli("job", "stop", job_id, check=True)
    jump(scene, offset, -3600, "back")  # an hour back, right after the stop was asked
    assert launcher.wait(timeout=60) != 0  # killed after its grace period, not an hour later
    assert time.monotonic() - asked >= GRACE_S
    killed = scene.node.events("JOB_STOPPED", subject=job_id, contains="killed")
    assert any(e["data"].get("step") == "killed" for e in killed)
    scene.assert_alive()
    scene.assert_protected_untouched()


def test_a_job_registry_converts_each_wall_time_once(tmp_path: Path, monkeypatch: Any) -> None:
    """The seam under the daemon test: a stop's time is taken to the monotonic clock once, so
    a later jump of the wall clock (faked here) does not move it."""
    registry = JobRegistry(tmp_path / "jobs", lambda record: None, "linux")
    record = registry.register(0, Manifest(name="j"), ["true"], 1, 0.0)
    registry.update(record.id, stop_requested=time.time())
    first = registry.observations({}, time.monotonic())[record.id]
    real = time.time
    for shift in (-3600.0, 30 * DAY):
        monkeypatch.setattr(time, "time", lambda shift=shift: real() + shift)
        later = registry.observations({}, time.monotonic())[record.id]
        assert later.stop_requested_at == first.stop_requested_at
        assert later.submitted_at == first.submitted_at


def test_a_certificate_from_the_future_does_not_hold() -> None:
    now = time.time()
    cert = Certificate("prot", "gpu", 0.5, 0.01, 0.0, 0.02, 0.05, "run-1", issued_at=now + DAY, node="n")
    state, why = status(cert, now, {}, None)
    assert state == "stale" and "set back" in why
    assert status(cert, now + DAY, {}, None)[0] == "valid"  # its own time: it holds
