"""A job's own reports (its events file) reach status, `arbiter explain` and `arbiter duty`."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from arbiter_testing.node import PYTHON, HarnessNode

JOB = """\
import json, os, sys, time
from arbiter.sdk.control import Control
ctl = Control()
ctl.phase("loading")
ctl.progress(1, 4)
ctl.phase("compute")
ctl.progress(3, 4)
with open(os.environ["ARBITER_EVENTS"], "a") as fh:
    fh.write(json.dumps({"t": time.time(), "event": "metric", "name": "gpu_duty", "busy": 0.2, "duty": 0.25}) + "\\n")
    fh.write('{"t": "soon", "event": "phase", "phase": "x"}\\n')
print("reported", flush=True)
time.sleep(60)
"""


def cli(node: HarnessNode, *args: str) -> str:
    out = node.cli(*args, COLUMNS="200")
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_what_a_job_says_of_itself_is_shown_beside_what_is_measured(tmp_path: Path) -> None:
    node = HarnessNode(tmp_path, tick_s=0.3)
    try:
        node.start()
        node.job_run([PYTHON, "-c", JOB, "reporter"], "--name", "reporter", stdout=subprocess.PIPE)

        def reported() -> dict[str, Any] | None:
            said = (node.job("reporter") or {}).get("reported") or {}
            return said if said.get("malformed") else None

        said = node.wait_for(reported, timeout=30)
        assert said["phase"]["name"] == "compute" and said["progress"] == {
            "done": 3,
            "total": 4,
            "at": said["progress"]["at"],
        }
        assert said["duty"]["duty"] == 0.25 and said["duty"]["device"] == "gpu" and said["lines"] == 5
        events = node.known_job("reporter")["id"]
        assert (
            said["malformed"] == 1 and "events.jsonl line 6: phase.t: Input should be a valid number" in said["problem"]
        )
        assert events in said["problem"]

        explained = cli(node, "explain", "reporter")
        assert (
            "it reports: phase compute, 3/4 done (75%), holds duty 0.25 (gpu busy 0.20 by its own measure)" in explained
        )
        assert "its events file:" in explained and "line 6" in explained
        duty = cli(node, "duty")
        assert "0.25" in duty  # the reported column
    finally:
        node.close()
