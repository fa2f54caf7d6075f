"""A phase written to a watched file pauses GPU work between ticks, and its end resumes it."""

from __future__ import annotations

import json
import time
from pathlib import Path

from arbiter_testing.node import PYTHON, HarnessNode
from arbiter_testing.rules import phase_rule

from .conftest import Procs


def phase(path: Path, value: str) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps({"t": time.time(), "event": "status", "state": {"phase": value}}) + "\n")


def test_immediate_phase_pauses_between_ticks_and_soon_holds_new_starts(tmp_path: Path, procs: type[Procs]) -> None:
    events = tmp_path / "events.jsonl"
    events.touch()
    node = HarnessNode(tmp_path, tick_s=5)  # a long tick: only the watch can be this quick
    try:
        node.add_rule(
            "p",
            phase_rule(
                "p", "sleep 1001", events, on=["uploading"], soon=["preparing"], field="state.phase", tags=["uplink"]
            ),
        )
        node.start()
        node.spawn(["sleep", "1001"])
        node.call("reload")  # not needed for correctness; the next tick would also see the program
        node.job_run([PYTHON, "-m", "arbiter.demo.job", "--plain"], "--name", "plain")
        node.job_run(
            [PYTHON, "-m", "arbiter.demo.job", "--plain"],
            "--name",
            "cpu",
            "--manifest",
            str(write_cpu_manifest(tmp_path)),
        )
        pid = node.job_pid("plain", timeout=20)
        cpu_pid = node.job_pid("cpu", timeout=20)
        node.wait_for(lambda: node.status()["rules"][0]["running"], timeout=20)

        phase(events, "uploading")
        took = procs.wait(pid, {"stopped"}, timeout=2)
        print(f"\nphase write -> job stopped: {1000 * took:.1f} ms (tick 5 s)")
        assert took < 1.0
        assert procs.state(cpu_pid) != "stopped"  # scope gpu leaves CPU work alone
        reason = node.reasons("plain", "PROTECTION_PHASE_ON")[0]
        assert reason["code"] == "PROTECTION_PHASE_ON" and "uplink" in reason["message"]
        on = node.events("PROTECTION_PHASE_ON")[-1]
        assert on["data"]["seen_by"] == "watch" and on["data"]["latency_ms"] < 1000

        phase(events, "idle")
        assert procs.wait(pid, {"running", "sleeping"}, timeout=2) < 1.0

        phase(events, "preparing")
        node.wait_for(
            lambda: (
                node.known_job("plain")["reasons"]
                and node.known_job("plain")["reasons"][0]["code"] == "PROTECTION_PHASE_SOON"
            )
        )
        assert procs.state(pid) != "stopped"  # soon: a job that cannot cooperate keeps running
        launcher = node.job_run([PYTHON, "-c", "pass"], "--name", "late")
        node.wait_for(lambda: (node.job("late") or {}).get("state") == "held")
        phase(events, "idle")
        assert launcher.wait(timeout=10) == 0
        fast = node.status()["fast_path"]
        assert fast["count"] >= 3 and fast["p99_ms"] is not None
        # each thread on the way asked the host for a core sooner, and status tells what it got
        assert {"decide", "source p/during.0"} <= set(fast["threads"])
        shown = node.cli("status")
        assert "fast-path threads (" in shown.stdout and "source p/during.0" in shown.stdout, shown.stdout
    finally:
        node.close()


def write_cpu_manifest(tmp_path: Path) -> Path:
    path = tmp_path / "cpu.yaml"
    path.write_text("name: cpu\ngpu: {use: none}\n")
    return path


def test_unreadable_phase_source_counts_as_on(tmp_path: Path, procs: type[Procs]) -> None:
    node = HarnessNode(tmp_path)
    try:
        node.add_rule(
            "p",
            {
                "id": "p",
                "match": {"cmdline": ["sleep 1002"]},
                "during": [
                    {
                        "source": {
                            "kind": "jsonl",
                            "path": str(tmp_path / "missing" / "e.jsonl"),
                            "event": "status",
                            "field": "phase",
                            "on": ["on"],
                        }
                    }
                ],
            },
        )
        node.start()
        node.job_run([PYTHON, "-m", "arbiter.demo.job", "--plain"], "--name", "plain")
        pid = node.job_pid("plain")
        assert node.known_job("plain")["state"] == "run"  # the program does not run: nothing to protect
        node.spawn(["sleep", "1002"])
        procs.wait(pid, {"stopped"}, timeout=10)
        node.reasons("plain", "PROTECTION_SOURCE_UNREADABLE")
    finally:
        node.close()


PROTECTED_WRITER = r"""
import json, os, sys, time
events, go, job_pid = sys.argv[1], sys.argv[2], sys.argv[3]
while not os.path.exists(go):
    time.sleep(0.01)

def write(**line):
    with open(events, "a") as fh:
        fh.write(json.dumps(line) + "\n")

def job_state():
    return open(f"/proc/{job_pid}/stat").read().rsplit(")", 1)[1].split()[0]

write(event="status", phase="uploading")
time.sleep(0.02)  # the program's next write comes 20 ms later
write(event="check", job_state=job_state())
time.sleep(0.3)
write(event="status", phase="idle")
time.sleep(0.02)
write(event="check", job_state=job_state())
time.sleep(60)
"""


def test_a_job_is_stopped_before_the_protected_programs_next_write(tmp_path: Path, procs: type[Procs]) -> None:
    events = tmp_path / "events.jsonl"
    events.touch()
    go = tmp_path / "go"
    node = HarnessNode(tmp_path, tick_s=5)
    try:
        node.add_rule(
            "writer",
            phase_rule("writer", "protected-writer", events, on=["uploading"]),
        )
        node.start()
        node.job_run([PYTHON, "-c", "import time\nwhile True: time.sleep(0.001)"], "--name", "plain")
        pid = node.job_pid("plain", timeout=20)
        node.spawn([PYTHON, "-c", PROTECTED_WRITER, str(events), str(go), str(pid), "protected-writer"])
        node.call("reload")
        node.wait_for(lambda: node.status()["rules"][0]["running"], timeout=20)
        go.touch()
        checks = node.wait_for(
            lambda: (
                [json.loads(x) for x in events.read_text().splitlines() if '"check"' in x][1:]
                and [json.loads(x) for x in events.read_text().splitlines() if '"check"' in x]
            )
        )
        assert [c["job_state"] for c in checks] == ["T", "S"] or [c["job_state"] for c in checks] == ["T", "R"], checks
        source = node.status()["rules"][0]["sources"][0]
        assert source["latency"]["count"] >= 2 and source["seen_by"] == "watch"
    finally:
        node.close()


def test_on_exec_holds_work_while_a_process_runs(tmp_path: Path, procs: type[Procs]) -> None:
    node = HarnessNode(tmp_path)
    try:
        node.add_rule(
            "backup",
            {
                "id": "backup",
                "match": {"cmdline": ["sleep 1007"]},
                "during": [
                    {
                        "source": {"kind": "on_exec", "match": {"cmdline": ["sleep 1006"]}},
                        "pause_fleet": {"scope": "all"},
                    }
                ],
            },
        )
        node.start()
        node.spawn(["sleep", "1007"])
        node.job_run([PYTHON, "-c", "import time\nwhile True: time.sleep(0.01)"], "--name", "plain")
        pid = node.wait_for(
            lambda: (node.job("plain") or {}).get("state") == "run" and (node.known_job("plain")["pids"] or [None])[0]
        )
        uploader = node.spawn(["sleep", "1006"])
        procs.wait(pid, {"stopped"}, timeout=5)
        node.reasons("plain", "PROTECTION_PHASE_ON")
        assert node.events("PROTECTION_PHASE_ON", subject="backup")[-1]["data"]["seen_by"] == "tick"
        uploader.kill()
        procs.wait(pid, {"running", "sleeping"}, timeout=5)
    finally:
        node.close()


def test_an_unreadable_progress_source_holds_gpu_work_until_it_reads(tmp_path: Path, procs: type[Procs]) -> None:
    progress = tmp_path / "later" / "progress.jsonl"
    node = HarnessNode(tmp_path, governor={"period_s": 2})  # rates over a 2 s window
    try:
        node.add_rule(
            "trainer",
            {
                "id": "trainer",
                "match": {"cmdline": ["sleep 1008"]},
                "protect": {"source": {"kind": "jsonl", "path": str(progress), "event": "step_done"}},
            },
        )
        node.start()
        node.spawn(["sleep", "1008"])
        node.wait_for(lambda: node.status()["rules"][0]["running"])  # else the job may start and end first
        node.job_run([PYTHON, "-c", "pass"], "--name", "plain")
        node.reasons("plain", "PROTECTION_SOURCE_UNREADABLE", timeout=15)
        explained = node.call("explain", subject="plain")["explain"]["items"][0]["reasons"][0]
        assert str(progress.parent) in explained["message"] and explained["remedy"]
        progress.parent.mkdir()
        with open(progress, "w") as fh:
            for _ in range(5):
                fh.write(json.dumps({"event": "step_done"}) + "\n")
        node.wait_for(lambda: (node.job("plain") or {"state": "ended"}).get("state") != "held")
        src = node.wait_for(
            lambda: (
                node.status()["rules"][0]["sources"][0]["rate"] is not None and node.status()["rules"][0]["sources"][0]
            )
        )
        assert src["slot"] == "progress" and src["count"] == 5 and src["rate"] > 0
    finally:
        node.close()
