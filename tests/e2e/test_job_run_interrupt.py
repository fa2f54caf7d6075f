"""^C on `arbiter job run` while its command is paused: the command cannot act on the signal
while stopped, so the job is stopped through the daemon (continued first, then ended) and
`job run` returns, rather than waiting as long as the pause lasts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from arbiter_testing.node import PYTHON, HarnessNode
from arbiter_testing.rules import own_sleep, phase_rule
from arbiter_testing.signals import other_threads, signal_thread

from .conftest import Procs


def test_ctrl_c_on_a_paused_job_ends_it(tmp_path: Path, procs: type[Procs]) -> None:
    events = tmp_path / "events.jsonl"
    events.touch()
    marker = own_sleep(1013)
    node = HarnessNode(tmp_path)
    node.add_rule("p", phase_rule("p", marker, events, on=["busy"]))
    try:
        node.start()
        node.spawn(marker.split())
        runner = node.job_run([PYTHON, "-m", "arbiter.demo.job", "--plain"], "--name", "plain", stderr=subprocess.PIPE)
        pid = node.job_pid("plain", timeout=20)
        node.wait_for(lambda: node.status()["rules"][0]["running"], timeout=20)
        with open(events, "a") as fh:
            fh.write(json.dumps({"event": "status", "phase": "busy"}) + "\n")
        procs.wait(pid, {"stopped"}, timeout=20)
        # what a terminal's ^C does: the signal to every process of the foreground group
        os.kill(pid, signal.SIGINT)
        runner.send_signal(signal.SIGINT)
        code = runner.wait(30)
        assert code != 0 and procs.state(pid) in ("gone", "zombie")
        assert runner.stderr is not None
        said = runner.stderr.read().decode()
        assert "interrupted: stopping job plain-" in said, said
    finally:
        node.close()


def test_a_stop_signal_taken_by_another_thread_of_job_run_still_ends_the_job(
    tmp_path: Path, procs: type[Procs]
) -> None:
    # The kernel may hand a signal sent to a process to any of its threads; tgkill gives it
    # to one that is not the main one, which waits for the command all along.
    node = HarnessNode(tmp_path)
    try:
        node.start()
        runner = node.job_run([PYTHON, "-m", "arbiter.demo.job", "--plain"], "--name", "plain")
        pid = node.job_pid("plain", timeout=20)
        others = node.wait_for(lambda: other_threads(runner.pid))
        signal_thread(runner.pid, others[0], signal.SIGTERM)
        assert runner.wait(30) == 128 + signal.SIGTERM  # the command ended on the daemon's SIGTERM
        assert procs.state(pid) in ("gone", "zombie")
    finally:
        node.close()
