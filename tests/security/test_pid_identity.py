"""Signals go only to processes arbiter started or matched, checked against the start time
recorded for them right before sending; a pid that now names another process gets nothing,
and the timeline says why (PID_REUSED)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from arbiter.plugin import JobTarget, PluginContext, ProcessRef, Translator
from arbiter.sdk.supervisor import signal_group
from arbiter.state.journal import PausedEntry, PausedJournal
from arbiter_testing.node import HarnessNode
from arbiter_testing.waiting import wait_until
from arbiter_translators import CgroupFreezeTranslator, SignalTranslator


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def sleeper(started: list[subprocess.Popen[bytes]], start_new_session: bool = False) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["sleep", "300"], start_new_session=start_new_session)
    started.append(proc)
    return proc


def state(pid: int) -> str:
    return psutil.Process(pid).status()


def wait_state(pid: int, wanted: set[str], timeout: float = 10.0) -> str:
    """Wait until ``pid`` is in one of the ``wanted`` states; that state (or fail)."""

    def now_wanted() -> str | None:
        now = state(pid)
        return now if now in wanted else None

    return wait_until(now_wanted, timeout, f"pid {pid} to be one of {sorted(wanted)}")


def recorded_elsewhen(pid: int) -> ProcessRef:
    """What the record would hold had ``pid`` been a process that started 5 s earlier."""
    return ProcessRef(pid, psutil.Process(pid).create_time() - 5.0)


@pytest.mark.parametrize("kind", [SignalTranslator, CgroupFreezeTranslator])
def test_a_reused_pid_gets_no_signal_and_is_reported(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]], kind: type[Translator]
) -> None:
    heard: list[tuple[str, ProcessRef, str]] = []
    translator = kind(kind.Options(), PluginContext(state_dir=tmp_path, pid_reused=lambda *a: heard.append(a)))
    stranger = sleeper(sleepers)
    wait_state(stranger.pid, {"sleeping"})
    stale = recorded_elsewhen(stranger.pid)
    job = JobTarget("j1", "batch", (stale,))

    assert translator.pause(job) == []
    assert state(stranger.pid) == "sleeping"
    translator.terminate(job)
    translator.kill(job)
    assert stranger.poll() is None and state(stranger.pid) == "sleeping"
    os.kill(stranger.pid, signal.SIGSTOP)  # stopped by someone else: arbiter must not continue it
    wait_state(stranger.pid, {"stopped"})
    translator.resume([stale])
    # no wait: a SIGCONT wakes a stopped process before kill() returns to its sender
    assert state(stranger.pid) == "stopped"
    os.kill(stranger.pid, signal.SIGCONT)

    actions = [why.split(" pid ")[0] for _, _, why in heard]
    assert actions == ["did not pause", "did not terminate", "did not kill", "did not resume"], heard
    assert all(ref == stale and "the pid was reused" in why for _, ref, why in heard)
    assert [job_id for job_id, _, _ in heard] == ["j1", "j1", "j1", ""]

    # the same process, its start time right: signalled
    right = ProcessRef(stranger.pid, psutil.Process(stranger.pid).create_time())
    assert translator.pause(JobTarget("j1", "batch", (right,))) == [right]
    assert wait_state(stranger.pid, {"stopped"}) == "stopped"
    translator.resume([right])
    assert wait_state(stranger.pid, {"sleeping", "running"}) in ("sleeping", "running")
    assert len(heard) == 4


def test_a_daemon_never_continues_a_recorded_pid_that_is_now_another_process(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    """A daemon killed while it held a job paused left a record; by its next start that pid
    names another process (stopped by someone else).  It is left alone, and the timeline
    says so; the one recorded correctly is continued."""
    node = HarnessNode(tmp_path)
    node.state_dir.mkdir(parents=True)
    ours, stranger = sleeper(sleepers), sleeper(sleepers)
    for proc in (ours, stranger):
        os.kill(proc.pid, signal.SIGSTOP)
        assert wait_state(proc.pid, {"stopped"}) == "stopped"
    journal = PausedJournal(node.state_dir / "paused.journal")
    right = ProcessRef(ours.pid, psutil.Process(ours.pid).create_time())
    stale = recorded_elsewhen(stranger.pid)
    for ref in (right, stale):
        journal.append("pause", PausedEntry("job-1", "tree", ref.pid, ref.start_time, "signal"))
    journal.close()
    try:
        node.start()
        events = node.events(code="PID_REUSED", contains=f"pid {stranger.pid}")
        reused = next(e for e in events if e["code"] == "PID_REUSED")
        assert "no signal was sent" in reused["message"] and reused["data"]["pid"] == stranger.pid
        assert reused["subject"] == "job-1"
        assert wait_state(ours.pid, {"sleeping", "running"}) in ("sleeping", "running")
        assert state(stranger.pid) == "stopped"
    finally:
        node.close()
        os.kill(stranger.pid, signal.SIGCONT)


def test_a_group_is_signalled_only_while_its_id_is_still_the_one_it_led(
    sleepers: list[subprocess.Popen[bytes]],
) -> None:
    # the leader exited and was reaped, but left a child in its group: that child is reached
    leader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess; print(subprocess.Popen(['sleep', '300'], stdout=subprocess.DEVNULL).pid)",
        ],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    orphan = int(leader.communicate(timeout=30)[0])
    assert leader.returncode == 0 and os.getpgid(orphan) == leader.pid
    try:
        assert signal_group(leader, signal.SIGKILL)
        wait_until(
            lambda: not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == "zombie",
            10,
            "the orphan to be killed",
            ignore=(psutil.NoSuchProcess,),
        )
    finally:
        if psutil.pid_exists(orphan):
            os.kill(orphan, signal.SIGKILL)

    # a reaped leader whose number another session leader has now: nothing is sent
    gone = subprocess.Popen(["true"], start_new_session=True)
    gone.wait(timeout=10)
    newcomer = sleeper(sleepers, start_new_session=True)
    gone.pid = newcomer.pid  # what a reused pid looks like from here
    assert not signal_group(gone, signal.SIGKILL)
    assert newcomer.poll() is None and state(newcomer.pid) in ("running", "sleeping")
    # and one not reaped yet is its own
    assert signal_group(newcomer, signal.SIGTERM)
    assert newcomer.wait(timeout=10) == -signal.SIGTERM
