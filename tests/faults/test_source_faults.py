"""The JSONL source of a protected rule loses its file: deleted, or replaced by a directory,
while the program runs.  Its progress then counts as harm and its phase as on (SPEC section
5, "never guess in the user's favour"); a truncated file is followed from its top (tail -F),
keeping the phase it had until a new line changes it."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import Scene


def phase(path: Path, value: str) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps({"t": time.time(), "event": "status", "phase": value}) + "\n")


def step(path: Path, n: int) -> None:
    with open(path, "a") as fh:
        for i in range(n):
            fh.write(json.dumps({"event": "step_done", "step": i}) + "\n")


def rule(events: Path, kind: str) -> dict[str, Any]:
    base: dict[str, Any] = {"id": "prot", "match": {"cmdline": ["faults-protected-standin"]}}
    if kind == "progress":
        return {
            **base,
            "protect": {"metric": "gpu_share", "source": {"kind": "jsonl", "path": str(events), "event": "step_done"}},
        }
    return {
        **base,
        "protect": {"metric": "gpu_share"},
        "during": [
            {
                "source": {"kind": "jsonl", "path": str(events), "event": "status", "field": "phase", "on": ["busy"]},
                "pause_fleet": {"scope": "gpu"},
            }
        ],
    }


def lose(events: Path, how: str) -> None:
    os.unlink(events)
    if how == "directory":
        events.mkdir()


@pytest.mark.parametrize("kind", ["progress", "phase"])
@pytest.mark.parametrize("how", ["deleted", "directory"])
def test_a_source_file_that_goes_away_holds_fleet_work_and_is_named(scene: Scene, kind: str, how: str) -> None:
    events = scene.root / "events.jsonl"
    events.touch()
    scene.node.add_rule("prot", rule(events, kind))
    scene.start()
    step(events, 3)
    scene.run_job("fleet")

    lose(events, how)
    # (a directory replaces the file a moment after it is gone: wait until the source says so)
    said = "is a directory" if how == "directory" else str(events)
    reason = scene.held("fleet", "PROTECTION_SOURCE_UNREADABLE", says=said, timeout=60)
    assert str(events) in reason["message"], reason
    assert ("counts as on" if kind == "phase" else "counts as harm") in reason["message"]
    explained = scene.explained("PROTECTION_SOURCE_UNREADABLE", "fleet")
    assert "path or permissions" in explained["remedy"]
    scene.assert_alive()
    scene.assert_protected_untouched()

    if how == "directory":
        shutil.rmtree(events)
    events.touch()  # the file comes back: the source reads it again and the work goes on
    step(events, 3)
    scene.node.wait_for(lambda: scene.node.known_job("fleet")["state"] == "run", timeout=60)
    scene.assert_protected_untouched()


def test_a_truncated_phase_file_keeps_its_phase_and_is_followed_from_the_top(scene: Scene) -> None:
    events = scene.root / "events.jsonl"
    events.touch()
    scene.node.add_rule("prot", rule(events, "phase"))
    scene.start()
    scene.run_job("fleet")
    phase(events, "busy")
    scene.held("fleet", "PROTECTION_PHASE_ON")

    os.truncate(events, 0)  # copytruncate, or the program started its log over
    scene.node.wait_for(lambda: scene.rule()["phases"] == ["on"], timeout=10)
    scene.ticks(3)  # several ticks see the empty file
    assert scene.node.known_job("fleet")["state"] == "paused"  # an empty file does not end the phase
    scene.assert_alive()
    scene.assert_protected_untouched()

    phase(events, "idle")  # a line written after the truncation is read
    scene.node.wait_for(lambda: scene.node.known_job("fleet")["state"] == "run", timeout=30)
    scene.assert_protected_untouched()
