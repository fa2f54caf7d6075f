"""A foreground daemon says what it decides: every timeline entry is a log line too, the ones
that say something is wrong as warnings."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from arbiter.daemon.recorder import Recorder
from arbiter.engine import codes
from arbiter.state.store import Store


def test_every_timeline_entry_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = Store(tmp_path / "state.db")
    seen: list[dict[str, object]] = []
    recorder = Recorder(store, seen.append)
    recorder.start()
    try:
        with caplog.at_level(logging.INFO, logger="arbiter.timeline"):
            recorder.event(codes.JOB_HELD, "batch-1", "job batch waits: 'trainer' uses the GPU")
            recorder.event(codes.CONFIG_REJECTED, "/etc/arbiter/tenants.d/x.yaml", "never valid, GPU work held")
            recorder.flush()
    finally:
        recorder.close()
        store.close()
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "arbiter.timeline"]
    assert lines == [
        (logging.INFO, "JOB_HELD batch-1: job batch waits: 'trainer' uses the GPU"),
        (logging.WARNING, "CONFIG_REJECTED /etc/arbiter/tenants.d/x.yaml: never valid, GPU work held"),
    ]
    assert len(seen) == 2
