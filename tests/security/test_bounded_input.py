"""A file an account may write that a root daemon follows costs the daemon a bounded amount of
reading, whatever the account does to it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from arbiter_testing import run_as
from arbiter_testing.node import HarnessNode
from arbiter_testing.rules import phase_rule

from .conftest import needs_root

NOBODY = 65534


@needs_root
def test_a_phase_file_made_terabytes_of_holes_is_unreadable_and_the_daemon_stops_in_time(shared_root: Path) -> None:
    """``nobody`` truncates the phase file it writes up to 4 TB of holes: the root daemon's
    follower reads one bounded pass, then counts the file unreadable (fail safe); the rule
    removed and the daemon stopped, it ends in time (before, each follower read zeros
    without end, and the daemon outlived its stop)."""
    theirs = shared_root / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    phases = theirs / "phase.jsonl"

    def write(text: str) -> None:
        with open(phases, "a") as fh:
            fh.write(text)

    run_as("nobody", lambda: write(json.dumps({"event": "status", "phase": "idle"}) + "\n"))
    node = HarnessNode(shared_root / "node")
    rule = node.add_rule("holes", phase_rule("holes", "sleep 1038", str(phases), on=["render"]))
    node.start()
    try:
        node.wait_for(lambda: node.known_rule("holes")["sources"][0]["readable"])
        run_as("nobody", lambda: os.truncate(phases, 4 << 40))
        source = node.wait_for(
            lambda: (s := node.known_rule("holes")["sources"][0]) and not s["readable"] and s, timeout=60
        )
        assert "sparse or runaway" in json.dumps(source), source
        rule.unlink()
        node.call("reload")
        node.wait_for(lambda: not [r for r in node.status()["rules"] if r["id"] == "holes"])
    finally:
        began = time.monotonic()
        code = node.stop(timeout=20)
        took = time.monotonic() - began
        node.close()
    assert code == 0 and took < 15, (code, took)
