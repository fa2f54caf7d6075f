"""A source in a user's home that the daemon does not read is read by a session helper there.

The daemon runs with another home (as a system service does), so ``~/…`` in a rule is not
in its reach; ``arbiter helper`` in this user's session reads it and reports only counts
and phase states.
"""

from __future__ import annotations

import json
import pwd
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

import pytest

from arbiter.api.transport import Connection, RequestRefused
from arbiter_testing.node import PYTHON, HarnessNode
from arbiter_testing.rules import phase_rule

from .conftest import Procs


def phase(path: Path, value: str) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps({"event": "status", "phase": value}) + "\n")


def source_of(node: HarnessNode, rule: str) -> dict[str, Any]:
    source: dict[str, Any] = node.known_rule(rule)["sources"][0]
    return source


def test_a_helper_reads_the_users_home_and_its_end_fails_safe(tmp_path: Path, procs: type[Procs]) -> None:
    home = Path(pwd.getpwuid(__import__("os").getuid()).pw_dir)
    if not home.is_dir():
        pytest.skip(f"this account's home {home} does not exist")
    private = Path(tempfile.mkdtemp(prefix=".arbiter-helper-test-", dir=home))
    node = HarnessNode(tmp_path, tick_s=0.5)
    try:
        events = private / "events.jsonl"
        events.touch()
        node.add_rule(
            "p",
            phase_rule("p", "sleep 1004", f"~/{private.name}/events.jsonl", on=["uploading"], scope="all"),
        )
        node.add_rule(
            "elsewhere",
            {
                "id": "elsewhere",
                "match": {"cmdline": ["sleep 1005"]},
                "during": [
                    {
                        "source": {
                            "kind": "jsonl",
                            "path": str(tmp_path / "other.jsonl"),
                            "event": "x",
                            "field": "p",
                            "on": ["y"],
                        }
                    }
                ],
            },
        )
        (tmp_path / "daemon-home").mkdir()
        node.start(HOME=str(tmp_path / "daemon-home"))
        node.spawn(["sleep", "1004"])
        node.job_run([PYTHON, "-c", "import time\nwhile True: time.sleep(0.01)"], "--name", "plain")
        node.reasons("plain", "PROTECTION_SOURCE_UNREADABLE", timeout=15)
        assert source_of(node, "p")["read_by"] == "daemon" and not source_of(node, "p")["readable"]

        helper = node.spawn([PYTHON, "-m", "arbiter", "helper", "--config", str(node.config_path)])
        pid = node.wait_for(
            lambda: (node.job("plain") or {}).get("state") == "run" and (node.known_job("plain")["pids"] or [None])[0]
        )
        src = source_of(node, "p")
        assert src["readable"] and src["read_by"].startswith("helper (uid ")
        assert node.status()["helpers"][0]["sources"] == 1

        phase(events, "uploading")
        took = procs.wait(pid, {"stopped"}, timeout=3)
        print(f"\nphase written in the user's home -> job stopped through the helper: {1000 * took:.1f} ms")
        node.reasons("plain", "PROTECTION_PHASE_ON")
        phase(events, "idle")
        procs.wait(pid, {"running", "sleeping"}, timeout=3)
        latency = node.wait_for(
            lambda: source_of(node, "p")["latency"]["count"] >= 2 and source_of(node, "p")["latency"]
        )
        assert latency["p99_ms"] < 1000

        # A helper is given, and may report, only its own home's sources: the daemon takes
        # the peer's uid from the socket, and a report carries counts and phases, nothing else.
        conn = Connection(node.socket)
        try:
            listing = conn.call("helper.attach")
            assert [(s["rule"], s["index"]) for s in listing["sources"]] == [("p", 0)]
            assert listing["sources"][0]["options"]["path"] == str(events)
            with pytest.raises(RequestRefused, match="not a source in the home"):
                conn.call("report", rule="elsewhere", index=0, readable=True, phase="off")
            with pytest.raises(RequestRefused, match="bad report"):
                conn.call("report", rule="p", index=0, readable=True, phase="off", text="file contents")
        finally:
            conn.close()

        helper.send_signal(signal.SIGTERM)
        helper.wait(10)
        procs.wait(pid, {"stopped"}, timeout=5)  # no helper: the phase counts as on again
        node.reasons("plain", "PROTECTION_SOURCE_UNREADABLE")
    finally:
        node.close()
        shutil.rmtree(private, ignore_errors=True)
