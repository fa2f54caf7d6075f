"""A GPU reader that works, then fails mid-run: it raises, hangs, or returns garbage (another
type, NaN, negative or impossible busy times, negative VRAM).  Garbage must never read as an
idle GPU: the protected program counts as using it, fleet work is paused, and the reader is
named (GPU_TIME_UNREADABLE on the job, PLUGIN_FAILED on the timeline) until it reads again."""

from __future__ import annotations

import pytest

from .conftest import Scene

FAULTS = {
    "raise": "the fake reader was told to fail",
    "hang": "no answer within",
    "not_a_reading": "not a GpuReading",
    "nan": "busy_ns['gfx'] is nan",
    "negative": "busy_ns['gfx'] is -1000000000",
    "huge": "busy_ns['gfx'] is 1000000000000000000000000000000",
    "negative_vram": "vram_bytes is -1073741824",
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_reader_failing_mid_run_pauses_fleet_work_and_is_named(scene: Scene, fault: str) -> None:
    scene.protect()
    scene.start()
    scene.run_job("fleet")  # the reader reads the program idle: the job runs

    scene.gpu(0.0, fault=fault, hang_s=6)
    scene.held("fleet", "GPU_TIME_UNREADABLE", says=FAULTS[fault])
    failed = scene.node.events("PLUGIN_FAILED", contains="readers/fake")
    assert any(FAULTS[fault] in e["message"] for e in failed), failed
    explained = scene.explained("GPU_TIME_UNREADABLE", "fleet")
    assert "arbiter doctor" in explained["remedy"]
    assert scene.node.known_job("fleet")["state"] == "paused"
    scene.assert_alive()
    scene.assert_protected_untouched()

    scene.gpu(0.0)  # the reader reads again: the work goes on
    scene.node.wait_for(lambda: scene.node.known_job("fleet")["state"] == "run", timeout=30)
    scene.assert_alive()
    scene.assert_protected_untouched()
