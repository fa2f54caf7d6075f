"""``arbiter resume-all`` continues what a dead daemon recorded as paused, and says which
recorded process it left alone because its pid now names another."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil

from arbiter.state.journal import PausedEntry, PausedJournal
from arbiter.state.store import Store
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


def test_resume_all_resumes_beside_a_broken_plugin_section_and_ends_the_eviction_clock(tmp_path: Path) -> None:
    """After a crash the service manager runs it on the config as it is: a plugin's section
    with a problem (the daemon would refuse to start on it) must not keep the jobs stopped."""
    node = HarnessNode(tmp_path, slurm={"node": "n1", "drain_after_s": -1})
    node.state_dir.mkdir(mode=0o700)
    paused = subprocess.Popen(["sleep", "30"])
    try:
        os.kill(paused.pid, signal.SIGSTOP)
        journal = PausedJournal(node.state_dir / "paused.journal")
        journal.append(
            "pause", PausedEntry("j1", "tree", paused.pid, psutil.Process(paused.pid).create_time(), "signal")
        )
        journal.close()
        store = Store(node.state_dir / "state.db")
        with store.transaction() as db:  # protection had paused it an hour before the crash
            Store.put_held(db, {"j1": time.time() - 3600})

        out = node.cli("resume-all")
        assert out.returncode == 0 and "resumed 1 item(s)" in out.stdout, out.stdout + out.stderr
        wait_until(
            lambda: psutil.Process(paused.pid).status() != psutil.STATUS_STOPPED, 10, "the paused job to continue"
        )
        assert store.held() == {}  # it runs: its next protection pause starts from zero
        store.close()
    finally:
        paused.kill()
        paused.wait()
