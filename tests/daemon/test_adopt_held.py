"""A process handed over as a scheduler's job while the node protects is held before it
does any work: ``job.adopt`` answers once the decision on the job has acted, so a task whose
hook hands it over (and waits for the answer) never gets past the hook.  With a real daemon,
a real protected stand-in and a real process that counts its steps in a file."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from arbiter.api.transport import RequestRefused
from arbiter_testing.node import PYTHON, HarnessNode
from arbiter_testing.waiting import wait_until

pytestmark = [pytest.mark.slow]

WAIT_S = 60.0

#: hands itself over as ``batch-7``, as a scheduler's task hook hands over its task, then
#: counts its steps in a file (a step counted is work done) and keeps the verdict it was
#: answered with
COUNTER = """\
import json, os, sys, time
from arbiter.api.transport import request
sock, counter = sys.argv[1], sys.argv[2]
answer = request(sock, "job.adopt", id="batch-7", pid=os.getpid(), timeout=30.0)
n = 0
while True:
    n += 1
    with open(counter + ".tmp", "w") as fh:
        fh.write(str(n))
    os.replace(counter + ".tmp", counter)
    if n == 1:
        with open(counter + ".answer", "w") as fh:
            json.dump(answer, fh)
    time.sleep(0.01)
"""


def _paused(node: HarnessNode, subject: str) -> dict[str, Any] | None:
    """The job's explain item once it is paused (None before it is known, or while it is not)."""
    try:
        (item,) = node.call("explain", subject=subject)["explain"]["items"]
    except RequestRefused:
        return None
    return item if item["state"] == "paused" else None


def _answer(path: Path) -> dict[str, Any] | None:
    try:
        answer: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # not written yet, or half-way
    return answer


def _state(pid: int) -> str:
    try:
        return str(psutil.Process(pid).status())
    except psutil.NoSuchProcess:
        return "gone"


def test_a_process_handed_over_while_the_node_protects_does_no_work_until_released(tmp_path: Path) -> None:
    node = HarnessNode(tmp_path)
    marker = f"arbiter.demo.protected --events {tmp_path / 'p.jsonl'}"
    node.add_rule("prot", {"id": "prot", "match": {"cmdline": [marker]}, "protect": {"metric": "gpu_share"}})
    counter = tmp_path / "steps"
    worker = None
    try:
        node.start()
        protected = node.spawn([PYTHON, "-m", "arbiter.demo.protected", "--events", str(tmp_path / "p.jsonl")])
        # the node protects: a job run now is held for the protected program
        node.job_run([sys.executable, "-c", "import time; time.sleep(300)"], "--name", "guard")
        node.reasons("guard", "PROTECTED_GPU_BUSY")

        worker = node.spawn([sys.executable, "-c", COUNTER, str(node.socket), str(counter)])
        item = node.wait_for(lambda: _paused(node, "batch-7"))
        assert item["reasons"][0]["code"] == "PROTECTED_GPU_BUSY", item
        wait_until(lambda: _state(worker.pid) == psutil.STATUS_STOPPED, WAIT_S, "the handed-over process stopped")
        assert not counter.exists(), f"it did {counter.read_text()} step(s) of work on a protected node"

        protected.terminate()
        protected.wait()
        # released, it runs: the file was missing for the hold, not because it never could
        wait_until(lambda: counter.exists(), WAIT_S, "the handed-over process working once released")
        # it was answered only once it was held, and the answer says why
        answer = wait_until(lambda: _answer(tmp_path / "steps.answer"), WAIT_S, "the answer it kept")
        verdict = answer["verdict"]
        assert verdict["state"] == "paused" and verdict["reasons"][0]["code"] == "PROTECTED_GPU_BUSY", answer
    finally:
        if worker is not None:
            worker.kill()
            worker.wait()
        node.close()
