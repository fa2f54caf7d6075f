"""The eviction clock outlives the daemon: a job that protection paused goes on counting from
when it was paused after a daemon killed with -9 starts again (it stayed paused meanwhile);
after a clean stop, which resumes it, the count starts again.  So do the protections that
``evict_after_s: auto`` chooses its wait from."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from arbiter.api.transport import RequestRefused
from arbiter_testing.node import PYTHON, HarnessNode
from arbiter_testing.rules import own_sleep
from arbiter_testing.waiting import wait_until

from .conftest import Procs

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

WAIT_S = 30.0
EVICT_S = 600.0  # long: the clock is read, the job is never stopped here
#: this test's own protected program
MARKER = own_sleep(965000)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[HarnessNode]:
    n = HarnessNode(tmp_path, tick_s=0.5, evict_after_s=EVICT_S)
    n.add_rule("game", {"id": "game", "match": {"cmdline": [MARKER]}, "pause_fleet": {"scope": "all"}})
    yield n
    n.close()


def paused_for(node: HarnessNode, name: str) -> float | None:
    """How long protection has paused the job, as ``arbiter explain`` says (None: it has not,
    or the daemon does not know it yet: one started again knows it once its ``arbiter job
    run`` registers it again)."""
    try:
        (item,) = node.call("explain", subject=name)["explain"]["items"]
    except RequestRefused as exc:
        if exc.code == "UNKNOWN_SUBJECT":
            return None
        raise
    pause = item.get("protection_pause")
    return None if item["state"] != "paused" or not pause else float(pause["for_s"])


def held_job(node: HarnessNode, procs: type[Procs]) -> tuple[int, float]:
    """A job held by the protected program for 2 s at least: its pid and when it was first seen
    paused (a monotonic time no later than its pause)."""
    node.start()
    node.job_run([PYTHON, "-m", "arbiter.demo.job", "--plain"], "--name", "plain")
    pid = node.job_pid("plain")
    node.spawn(MARKER.split())
    procs.wait(pid, {"stopped"}, timeout=WAIT_S)
    wait_until(lambda: (paused_for(node, "plain") or 0) >= 2.0, WAIT_S, "the job paused for 2 s", poll_s=0.1)
    return pid, time.monotonic()


def test_a_daemon_killed_and_started_again_goes_on_counting(node: HarnessNode, procs: type[Procs]) -> None:
    pid, seen = held_job(node, procs)
    before = paused_for(node, "plain")
    assert before is not None
    node.kill_daemon()
    assert procs.state(pid) == "stopped"  # paused while no daemon is there
    node.start()
    after = wait_until(lambda: paused_for(node, "plain"), WAIT_S, "the job paused again", poll_s=0.1)
    # counted from the first pause: at least what it had, plus the time since it was read;
    # counted from the restart it would be less than that time alone
    assert after >= before + (time.monotonic() - seen) - 1.0, (before, after)
    assert node.events("JOB_RESUMED", contains="left by a previous daemon")


def test_a_clean_stop_resumes_the_job_and_the_count_starts_again(node: HarnessNode, procs: type[Procs]) -> None:
    pid, _ = held_job(node, procs)
    node.stop()
    procs.wait(pid, {"running", "sleeping", "disk-sleep"}, timeout=WAIT_S)  # it runs while no daemon is there
    restarted = time.monotonic()
    node.start()
    after = wait_until(lambda: paused_for(node, "plain"), WAIT_S, "the job paused again", poll_s=0.1)
    assert after <= time.monotonic() - restarted + 1.0, after  # from the restart, not from the first pause


def evict_basis(node: HarnessNode, name: str) -> str | None:
    """Why ``evict_after_s: auto`` chose the job's wait, as ``arbiter explain`` says (None while
    protection does not pause it)."""
    (item,) = node.call("explain", subject=name)["explain"]["items"]
    pause = item.get("protection_pause")
    return str(pause["evict_basis"]) if item["state"] == "paused" and pause and pause["evict_basis"] else None


def test_auto_weighs_the_protections_seen_before_a_restart(tmp_path: Path, procs: type[Procs]) -> None:
    """``evict_after_s: auto`` chooses from the rule's latest protections: one that ended before
    the daemon stopped still counts after it starts again (before, a restarted node chose as
    one that had seen none: the cost alone)."""
    node = HarnessNode(tmp_path, tick_s=0.5, evict_after_s="auto", evict_cost_s=EVICT_S)
    node.add_rule("game", {"id": "game", "match": {"cmdline": [MARKER]}, "pause_fleet": {"scope": "all"}})
    try:
        node.start()
        node.job_run([PYTHON, "-m", "arbiter.demo.job", "--plain"], "--name", "plain")
        pid = node.job_pid("plain")
        game = node.spawn(MARKER.split())
        procs.wait(pid, {"stopped"}, timeout=WAIT_S)
        first = wait_until(lambda: evict_basis(node, "plain"), WAIT_S, "the first pause's basis", poll_s=0.1)
        assert "no protection by 'game' has ended here yet" in first, first
        game.kill()
        game.wait()
        procs.wait(pid, {"running", "sleeping", "disk-sleep"}, timeout=WAIT_S)  # the protection has ended
        node.stop()
        node.start()
        node.job_run([PYTHON, "-m", "arbiter.demo.job", "--plain"], "--name", "again")
        again_pid = node.job_pid("again")
        node.spawn(MARKER.split())
        procs.wait(again_pid, {"stopped"}, timeout=WAIT_S)
        basis = wait_until(lambda: evict_basis(node, "again"), WAIT_S, "the second pause's basis", poll_s=0.1)
        assert "the last 1 protection(s) by 'game'" in basis, basis
    finally:
        node.close()
