"""Ended jobs leave nothing behind for ever: any account may register jobs, and rows with
long command lines and a folder each, kept without end, filled the disk and slowed status."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from arbiter.config.jobdocs import Manifest
from arbiter.daemon.jobs import JobRegistry
from arbiter.state.store import ENDED_JOBS_KEPT_S, Store


def test_ended_jobs_rows_and_folders_go_after_the_retention(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    store = Store(state / "state.db")
    registry = JobRegistry(state / "jobs", lambda record: Store.put_job(store._db, record), "linux-x86_64")
    old = registry.register(os.getuid(), Manifest(name="old"), ["x" * 50_000], os.getpid(), 0.0)
    recent = registry.register(os.getuid(), Manifest(name="recent"), ["true"], os.getpid(), 0.0)
    long_ago = time.time() - ENDED_JOBS_KEPT_S - 60
    registry.update(old.id, state="ended", ended=long_ago)
    registry.update(recent.id, state="ended", ended=time.time())
    os.utime(state / "jobs" / old.id, (long_ago, long_ago))
    registry._sweep_at = 0.0  # the sweep runs at most every few minutes: now
    fresh = registry.register(os.getuid(), Manifest(name="fresh"), ["true"], os.getpid(), 0.0)
    assert sorted(p.name for p in (state / "jobs").iterdir()) == sorted([recent.id, fresh.id])
    assert {r.id for r in store.jobs(include_ended=True)} == {recent.id, fresh.id}
    store.close()


def test_a_link_among_the_job_folders_is_not_followed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "jobs").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("keep")
    long_ago = time.time() - ENDED_JOBS_KEPT_S - 60
    os.symlink(elsewhere, state / "jobs" / "gone-abc123")
    os.utime(state / "jobs" / "gone-abc123", (long_ago, long_ago), follow_symlinks=False)
    registry = JobRegistry(state / "jobs", lambda record: None, "linux-x86_64")
    registry.register(os.getuid(), Manifest(name="fresh"), ["true"], os.getpid(), 0.0)
    assert (elsewhere / "keep").read_text() == "keep"


def test_a_jobs_folder_that_is_a_link_is_never_followed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, state / "jobs")
    registry = JobRegistry(state / "jobs", lambda record: None, "linux-x86_64")
    with pytest.raises(OSError, match="a link or not a folder"):
        registry.register(os.getuid(), Manifest(name="batch"), ["true"], os.getpid(), 0.0)
    assert list(elsewhere.iterdir()) == [] and not registry.active()
