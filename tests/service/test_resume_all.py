"""``arbiter resume-all`` continues what a dead daemon recorded as paused, and says which
recorded process it left alone because its pid now names another."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil

from arbiter.store import PausedEntry, PausedJournal
from arbiter_testing.node import HarnessNode
from arbiter_testing.waiting import wait_until


def test_resume_all_continues_the_recorded_process_and_names_the_one_whose_pid_was_reused(tmp_path: Path) -> None:
    node = HarnessNode(tmp_path)
    node.state_dir.mkdir(mode=0o700)
    paused = subprocess.Popen(["sleep", "30"])
    stranger = subprocess.Popen(["sleep", "30"])  # has the pid of a process a daemon once paused
    try:
        os.kill(paused.pid, signal.SIGSTOP)
        journal = PausedJournal(node.state_dir / "paused.journal")
        journal.append(
            "pause", PausedEntry("j1", "tree", paused.pid, psutil.Process(paused.pid).create_time(), "signal")
        )
        recorded_start = psutil.Process(stranger.pid).create_time() - 100
        journal.append("pause", PausedEntry("j2", "tree", stranger.pid, recorded_start, "signal"))
        journal.close()
        os.kill(stranger.pid, signal.SIGSTOP)  # stopped by someone else: it must stay so

        out = node.cli("resume-all")
        assert out.returncode == 0, out.stderr
        assert "resumed 2 item(s)" in out.stdout
        assert f"did not resume pid {stranger.pid}" in out.stdout and "reused" in out.stdout
        wait_until(
            lambda: psutil.Process(paused.pid).status() != psutil.STATUS_STOPPED, 10, "the paused job to continue"
        )
        assert psutil.Process(stranger.pid).status() == psutil.STATUS_STOPPED  # never signalled
    finally:
        for proc in (paused, stranger):
            proc.kill()
            proc.wait()
