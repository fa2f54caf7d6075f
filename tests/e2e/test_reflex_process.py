"""The reflex process acts on an immediate rule's phase changes beside the daemon; killed,
it is replaced, and meanwhile the daemon acts on them itself."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from arbiter.state.journal import PausedJournal
from arbiter_testing.node import PYTHON, HarnessNode
from arbiter_testing.rules import phase_rule
from arbiter_testing.waiting import wait_until

from .conftest import Procs


def phase(path: Path, value: str) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps({"event": "status", "phase": value}) + "\n")


def armed(node: HarnessNode) -> None:
    """Have the daemon decide once more, now that the reflex process watches the source, and
    wait for that decision: the daemon sends the process its arm under the signalling lock,
    before it lets go of it, and the process acts on a phase only with the last arm sent."""
    asked = time.time()
    node.call("reload")
    wait_until(lambda: node.status()["decided_at"] > asked, 30, "a decision after the reload")


def start(tmp_path: Path, **config: object) -> tuple[HarnessNode, Path, int]:
    events = tmp_path / "events.jsonl"
    events.touch()
    node = HarnessNode(tmp_path, tick_s=5, **config)  # a long tick: only a watch can be this quick
    node.add_rule(
        "p",
        phase_rule("p", "sleep 1011", events, on=["busy"]),
    )
    node.start()
    node.spawn(["sleep", "1011"])
    node.call("reload")
    node.job_run([PYTHON, "-m", "arbiter.demo.job", "--plain"], "--name", "plain")
    pid = node.job_pid("plain", timeout=20)
    node.wait_for(lambda: node.status()["rules"][0]["running"], timeout=20)
    return node, events, pid


def test_the_reflex_process_pauses_and_resumes_and_the_daemon_keeps_the_record(
    tmp_path: Path, procs: type[Procs]
) -> None:
    node, events, pid = start(tmp_path)
    try:
        process = node.wait_for(
            lambda: (p := node.status()["fast_path"]["reflex_process"]) and p["sources"] and p, timeout=20
        )
        assert process["pid"] and not process["failure"]
        armed(node)  # a decision after the process reported: it is armed

        phase(events, "busy")
        assert procs.wait(pid, {"stopped"}, timeout=2) < 1.0
        # the pause was the reflex process's: it says so, and its journal row is there
        node.wait_for(lambda: node.status()["fast_path"]["reflex_process"]["armed"] >= 1)
        journal = PausedJournal.replay(node.state_dir / "paused.journal")
        assert pid in {e.pid for e in journal.values()}
        threads = node.status()["fast_path"]["threads"]
        assert "in the reflex process" in threads["source p/during.0"]
        node.wait_for(lambda: node.known_job("plain")["state"] == "paused")

        phase(events, "idle")
        assert procs.wait(pid, {"running", "sleeping"}, timeout=2) < 1.0
        node.wait_for(lambda: node.known_job("plain")["state"] == "run")
        assert node.status()["fast_path"]["count"] >= 2
        timed = node.wait_for(lambda: (p := node.status()["fast_path"]["reflex_process"])["acted"]["count"] >= 2 and p)
        assert timed["locked"]["count"] == timed["first"]["count"] == timed["acted"]["count"]
        assert timed["locked"]["p50_ms"] <= timed["first"]["p50_ms"] <= timed["acted"]["p50_ms"]
    finally:
        node.close()
    assert procs.state(pid) in {"gone", "running", "sleeping"}


def test_a_killed_reflex_process_leaves_the_daemon_acting_then_is_replaced(tmp_path: Path, procs: type[Procs]) -> None:
    node, events, pid = start(tmp_path)
    try:
        first = node.wait_for(
            lambda: (p := node.status()["fast_path"]["reflex_process"]) and p["sources"] and p["pid"], timeout=20
        )
        armed(node)
        phase(events, "busy")
        procs.wait(pid, {"stopped"}, timeout=2)
        os.kill(first, signal.SIGKILL)
        gone = node.wait_for(
            lambda: [e for e in node.events("PLUGIN_FAILED") if "reflex process" in e["message"]], timeout=10
        )
        assert "given up" in gone[-1]["message"]

        # the daemon's own watcher and decisions act meanwhile, and what the process paused is resumed
        phase(events, "idle")
        assert procs.wait(pid, {"running", "sleeping"}, timeout=2) < 1.0
        phase(events, "busy")
        assert procs.wait(pid, {"stopped"}, timeout=2) < 1.0
        phase(events, "idle")
        procs.wait(pid, {"running", "sleeping"}, timeout=2)

        # another process starts once the retry time has passed
        second = node.wait_for(
            lambda: (
                (p := node.status()["fast_path"]["reflex_process"])["pid"] not in (None, first)
                and p["sources"]
                and p["pid"]
            ),
            timeout=30,
        )
        assert second != first
    finally:
        node.close()


def test_reflex_process_off_leaves_the_phase_to_the_decision_thread(tmp_path: Path, procs: type[Procs]) -> None:
    node, events, pid = start(tmp_path, reflex_process=False)
    try:
        assert node.status()["fast_path"]["reflex_process"] is None
        phase(events, "busy")
        assert procs.wait(pid, {"stopped"}, timeout=2) < 1.0
        assert "reflex process" not in node.status()["fast_path"]["threads"]["source p/during.0"]
    finally:
        node.close()


def test_ctrl_c_on_the_daemon_ends_the_reflex_process_quietly(tmp_path: Path) -> None:
    """^C at the daemon's terminal reaches every process of its group: the reflex process
    leaves it to the daemon, which stops it, rather than dying of it with a traceback."""
    node, _events, _pid = start(tmp_path)
    try:
        process = node.wait_for(lambda: (p := node.status()["fast_path"]["reflex_process"]) and p["pid"] and p)
        assert node.daemon is not None
        os.kill(process["pid"], signal.SIGINT)
        node.daemon.send_signal(signal.SIGINT)
        assert node.daemon.wait(30) == 0
        log = node.log()
        assert "Traceback" not in log and "KeyboardInterrupt" not in log, log
        assert "given up" not in log and "PLUGIN_FAILED" not in log, log
    finally:
        node.close()
