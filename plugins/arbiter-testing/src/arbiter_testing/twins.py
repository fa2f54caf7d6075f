"""Twin nodes sharing certificates through a folder, as the fleet-certificate tests set them
up: each node's signing key made before it starts (so every node's list of trusted keys is
known at once), the protected stand-in slowed by a known amount by a cooperative job, and
what a node says of the folder.

The job is ``tests/e2e/slowing_job.py``: while it runs at duty d the stand-in is slowed by
``gain · d²`` of each frame, so a paired run's verdict does not hang on the box's own noise.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from arbiter.state import fleetcerts as files
from arbiter_testing.node import PYTHON, HarnessNode

ROOT = Path(__file__).resolve().parents[4]
SLOWING_JOB = ROOT / "tests" / "e2e" / "slowing_job.py"
#: a paired run's windows short enough for a test, long enough to hold whole frames and duty samples;
#: 16 blocks, so that a loaded box's stalls do not leave the drift estimate too uncertain to decide
RUN = ["--yes", "--window", "1.5", "--washout", "0.5", "--blocks", "16", "--max-hours", "0.05", "--margin", "0.1"]
#: a twin's confirmation in longer windows, and a folder read twice a second: a confirmation's
#: few blocks, fixed before it starts, cannot outgrow a stall of a loaded box the way a run sized
#: by its pilot does, and one stall in a 1 s measured window moves its block's d by 0.3 or more
FLEET = {"scan_every_s": 0.5, "window_s": 3.0, "washout_s": 1.0, "max_hours": 0.05}
#: the node config a certified twin runs under in these tests
CERTIFIED: dict[str, Any] = {
    "gpu_jobs": "certified",
    "tick_s": 0.25,
    "gpu_release_after_s": 600,
    "compliance": {"sample_s": 0.5},
    "governor": {"period_s": 2, "baseline_s": 2, "rebaseline_s": 600, "take_back_s": 3, "grow_step": 0.05},
}


def make_key(root: Path) -> str:
    """Write a signing key into the state directory of the node at ``root``; its public key."""
    state = root / "state"
    state.mkdir(parents=True, mode=0o700, exist_ok=True)
    text = files.new_key_text()
    fd = os.open(state / "signing.key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    return files.public_text(files.load_key(text))


def stand_in_rule(events: Path) -> dict[str, Any]:
    return {
        "id": "frames",
        "match": {"cmdline": [f"arbiter.demo.protected --events {events}"]},
        "protect": {"source": {"kind": "jsonl", "path": str(events), "event": "step_done"}, "max_slowdown": 0.05},
    }


def start_stand_in(node: HarnessNode, events: Path, python: str = PYTHON) -> None:
    """100 frames a second on a fixed schedule, slowed only by the job's slow file."""
    node.spawn(
        [
            python,
            "-m",
            "arbiter.demo.protected",
            "--events",
            str(events),
            "--step-s",
            "0.002",
            "--gap-s",
            "0.006",
            "--no-pin",
            "--frame-s",
            "0.01",
            "--catch-up",
            "--slow-file",
            str(node.root / "slow"),
            "--slow-fresh-s",
            "0.25",
        ],
        env={**node.env(), "PYTHONPATH": str(ROOT)},
    )
    node.wait_for(lambda: node.status()["rules"][0]["running"])
    node.wait_for(lambda: node.status()["rules"][0]["sources"][0]["rate"])


def start_job(node: HarnessNode, gain: float = 1.0) -> None:
    """The cooperative job ``llmbatch`` that slows the node's stand-in by ``gain · duty²``."""
    manifest = node.root / "llmbatch.yaml"
    manifest.write_text(
        "name: llmbatch\ncapabilities: [cooperative_throttle, cooperative_pause, cancellable]\ngpu: {use: shared}\n"
    )
    node.job_run([PYTHON, str(SLOWING_JOB), str(node.root / "slow"), str(gain)], "--manifest", str(manifest))
    node.wait_for(lambda: node.job("llmbatch"))


def stop_programs(node: HarnessNode) -> None:
    """End what the test started on the node (its stand-in and its job)."""
    for proc in node.children:
        proc.terminate()
    for proc in node.children:
        proc.wait(30)


def newest_event(node: HarnessNode, code: str, timeout: float = 60) -> dict[str, Any]:
    """The newest timeline entry with ``code``, once there is one."""
    found = node.wait_for(lambda: node.call("timeline", code=code, limit=5)["events"], timeout=timeout)
    return max(found, key=lambda e: e["t"])


def fleet_files(node: HarnessNode) -> dict[str, dict[str, Any]]:
    """What the node came to on each file in the folder, by file name."""
    return {f["file"]: f for f in node.call("certificates")["fleet"]["files"]}


def running_certified(node: HarnessNode, timeout: float = 60) -> dict[str, Any]:
    """The node's duty view once its job runs under the governor's budget."""
    return node.wait_for(  # type: ignore[no-any-return]
        lambda: (d := node.call("duty")["duty"])["jobs"] and d["jobs"][0]["asked"] > 0 and d, timeout=timeout
    )


def held_certificates(node: HarnessNode) -> list[dict[str, Any]]:
    """The node's certificates once it holds one: the tick reads them again after a change, so
    one adopted may be on the timeline a moment before it is in the list."""
    return node.wait_for(lambda: node.call("certificates")["certificates"])  # type: ignore[no-any-return]
