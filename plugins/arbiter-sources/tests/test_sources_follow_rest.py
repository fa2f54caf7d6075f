"""A followed file that file notifications watch rests between its checks: its thread sleeps
until a watch wakes it, and looks at the path unasked only every ``SAFETY_INTERVAL_S``."""

from __future__ import annotations

import json
import select
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

from arbiter.plugin import PluginContext, SourceState
from arbiter_sources import JsonlSource, follow
from arbiter_testing.waiting import wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")


class RecordedPoll:
    """``select.poll`` that notes each wait's timeout (ms)."""

    waits: ClassVar[list[float | None]] = []

    def __init__(self) -> None:
        self._poll = REAL_POLL()

    def register(self, *args: Any) -> None:
        self._poll.register(*args)

    def unregister(self, fd: int) -> None:
        self._poll.unregister(fd)

    def poll(self, timeout: float | None = None) -> list[tuple[int, int]]:
        RecordedPoll.waits.append(timeout)
        return self._poll.poll(timeout)


REAL_POLL = select.poll


def write(path: Path, phase: str) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps({"event": "status", "phase": phase}) + "\n")


def test_a_quiet_watched_file_rests_between_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert follow.SAFETY_INTERVAL_S >= 10  # an idle node's watcher wakes this seldom at most
    monkeypatch.setattr(RecordedPoll, "waits", [])
    monkeypatch.setattr(select, "poll", RecordedPoll)  # the follower reads it from there
    path = tmp_path / "events.jsonl"
    path.touch()
    options = JsonlSource.Options.model_validate(
        {"kind": "jsonl", "path": str(path), "event": "status", "field": "phase", "on": ["on"]}
    )
    source = JsonlSource(options, PluginContext(state_dir=tmp_path))
    states: list[SourceState] = []
    try:
        source.start(states.append)
        write(path, "on")
        wait_until(lambda: states and states[-1].phase == "on", what="the first line read")
        # watched: the next wait is for a notification, or the safety interval, not less
        wait_until(
            lambda: any(w is not None and w > 0.9 * 1000 * follow.SAFETY_INTERVAL_S for w in RecordedPoll.waits),
            what=f"a wait of the safety interval (waits so far: {RecordedPoll.waits[-5:]})",
        )
        write(path, "off")
        wait_until(lambda: states[-1].phase == "off", what="the line a watch woke it for")
    finally:
        source.close()
