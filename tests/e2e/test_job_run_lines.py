"""What `arbiter job run` says while its job lives: each change once (paused with its reason,
resumed), never a line per look."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from arbiter.api.transport import Connection
from arbiter.api.verdict import verdict_mark
from arbiter_testing import wait_until
from arbiter_testing.node import PYTHON, HarnessNode
from arbiter_testing.rules import phase_rule


def phase(path: Path, value: str) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps({"t": time.time(), "event": "status", "state": {"phase": value}}) + "\n")


def test_job_run_says_paused_and_resumed_once_each(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.touch()
    node = HarnessNode(tmp_path, tick_s=1)
    try:
        node.add_rule(
            "p",
            phase_rule("p", "sleep 1002", events, on=["uploading"], field="state.phase"),
        )
        node.start()
        node.spawn(["sleep", "1002"])
        node.wait_for(lambda: node.status()["rules"][0]["running"], timeout=20)
        job = node.job_run([PYTHON, "-m", "arbiter.demo.job", "--plain"], "--name", "plain", stderr=subprocess.PIPE)
        said: list[str] = []

        def read() -> None:
            assert job.stderr is not None
            for line in job.stderr:
                said.append(line.decode(errors="replace").rstrip())

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        wait_until(lambda: any("admitted; starting" in s for s in said), 30, "the job to start")
        # the daemon knows its process: a phase before that holds a job not started yet, a
        # verdict its watcher rightly says ("waiting")
        node.job_pid("plain")
        phase(events, "uploading")
        wait_until(lambda: any(" paused: PROTECTION_PHASE_ON" in s for s in said), 30, "job run to say paused")
        phase(events, "idle")
        wait_until(lambda: any(s.endswith(" resumed") for s in said), 30, "job run to say resumed")
        time.sleep(3 * 1.0)  # three more looks: nothing new happened, so nothing more is said
        assert sum(" paused: " in s for s in said) == 1 and sum(s.endswith(" resumed") for s in said) == 1, said
        assert not [s for s in said if s.startswith("arbiter: waiting")], said
    finally:
        node.close()


def watch(node: HarnessNode, **args: Any) -> dict[str, Any]:
    """``job.wait`` as `job run`'s watcher asks it, on a connection that waits longer than it."""
    conn = Connection(node.socket, 60.0)
    try:
        return conn.call("job.wait", **args)
    finally:
        conn.close()


def test_a_job_watcher_is_answered_when_the_verdict_changes_not_every_second(tmp_path: Path) -> None:
    # `job run` hands the daemon the mark of what it shows: the daemon answers once the job's
    # verdict has another, so fifty quiet jobs cost a request each every half minute
    events = tmp_path / "events.jsonl"
    events.touch()
    node = HarnessNode(tmp_path, tick_s=0.5)
    try:
        node.add_rule("p", phase_rule("p", "sleep 1003", events, on=["uploading"], field="state.phase"))
        node.start()
        node.spawn(["sleep", "1003"])
        node.wait_for(lambda: node.status()["rules"][0]["running"], timeout=20)
        launcher = node.job_run(["sleep", "1004"], "--name", "quiet", stderr=subprocess.DEVNULL)
        node.wait_for(lambda: any(j["pids"] for j in node.status()["jobs"]), timeout=30)
        job_id = node.status()["jobs"][0]["id"]
        running = node.call("job.wait", id=job_id)
        assert running["state"] == "run", running
        asked = time.monotonic()
        same = watch(node, id=job_id, unless=verdict_mark(running), timeout=3.0)
        assert same["state"] == "run" and time.monotonic() - asked >= 2.5  # nothing changed
        answers: list[dict[str, Any]] = []
        watcher = threading.Thread(target=lambda: answers.append(watch(node, id=job_id, unless=verdict_mark(running))))
        watcher.start()
        phase(events, "uploading")
        watcher.join(timeout=30)
        assert answers and answers[0]["state"] == "paused", answers
        node.call("job.stop", id=job_id)
        launcher.wait(timeout=30)
    finally:
        node.close()
