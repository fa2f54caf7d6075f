"""A cooperative job that ignores its duty is paused after three samples, stopped the third
time, and the next run of its name waits; explain says why at each step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from arbiter_testing.node import PYTHON, HarnessNode

from .conftest import Procs


def greedy_node(tmp_path: Path, compliance: dict[str, Any]) -> tuple[HarnessNode, Path]:
    """A node with a quick compliance check, and the manifest of a job that asks for 0.1.

    The job spins without pause: over its duty by the tolerance (0.1) when it keeps above 0.2
    of a core, which it does beside as many as nine other busy processes on two cores (0.3
    would need it above 0.4: four others, which a loaded test machine can have).  So these
    tests run beside others."""
    manifest = tmp_path / "greedy.yaml"
    manifest.write_text("name: greedy\ncapabilities: [cooperative_throttle]\ngpu: {use: shared, max_duty: 0.1}\n")
    return HarnessNode(tmp_path, tick_s=0.5, stop_grace_s=1, compliance=compliance), manifest


def test_a_job_over_its_duty_is_paused_then_stopped_and_its_name_waits(tmp_path: Path, procs: type[Procs]) -> None:
    node, manifest = greedy_node(
        tmp_path, {"sample_s": 0.5, "pause_s": 2, "over_samples": 3, "strikes_to_stop": 3, "untrusted_s": 600}
    )
    try:
        node.start()
        launcher = node.job_run([PYTHON, "-c", "while True: pass"], "--manifest", str(manifest))
        pid = node.wait_for(
            lambda: (node.job("greedy") or {}).get("state") == "run" and (node.known_job("greedy")["pids"] or [None])[0]
        )
        assert node.known_job("greedy")["duty"] == 0.1
        for _strike in (1, 2):
            procs.wait(pid, {"stopped"}, timeout=10)
            node.reasons("greedy", "GPU_DUTY_EXCEEDED")
            explained = node.call("explain", subject="greedy")["explain"]["items"][0]["reasons"][0]
            assert "more of the GPU than its duty" in explained["message"] and "arbiter.sdk.Duty" in explained["remedy"]
            procs.wait(pid, {"running", "sleeping"}, timeout=10)  # the 2 s pause ends
        assert launcher.wait(timeout=20) != 0  # the third time: stopped
        untrusted = node.events("JOB_UNTRUSTED")[-1]
        assert untrusted["data"]["strikes"] == 3 and untrusted["data"]["name"] == "greedy"
        exceeded = node.events("GPU_DUTY_EXCEEDED")
        assert len(exceeded) == 2 and all("for 3 samples, over its duty 0.10" in e["message"] for e in exceeded)

        again = node.job_run([PYTHON, "-c", "pass"], "--manifest", str(manifest))
        node.wait_for(
            lambda: any(
                j["name"] == "greedy"
                and j["state"] == "held"
                and j["reasons"]
                and j["reasons"][0]["code"] == "JOB_UNTRUSTED"
                for j in node.status()["jobs"]
            )
        )
        assert again.poll() is None  # it waits
    finally:
        node.close()


def test_strikes_and_distrust_survive_a_daemon_restart(tmp_path: Path, procs: type[Procs]) -> None:
    node, manifest = greedy_node(
        tmp_path, {"sample_s": 0.5, "pause_s": 0.5, "over_samples": 2, "strikes_to_stop": 1, "untrusted_s": 600}
    )
    try:
        node.start()
        launcher = node.job_run([PYTHON, "-c", "while True: pass"], "--manifest", str(manifest))
        assert launcher.wait(timeout=20) != 0
        node.events("JOB_UNTRUSTED")
        node.stop()
        node.start()
        waiting = node.job_run([PYTHON, "-c", "pass"], "--manifest", str(manifest))
        node.wait_for(
            lambda: any(
                j["state"] == "held" and j["reasons"] and j["reasons"][0]["code"] == "JOB_UNTRUSTED"
                for j in node.status()["jobs"]
            )
        )
        assert waiting.poll() is None
    finally:
        node.close()
