"""The state directory refuses writes: full (the daemon's file size limit, RLIMIT_FSIZE, set
on the running daemon so that every write past 32 KiB fails with EFBIG, as a full disk
fails a write) or read-only (the state database bind-mounted read-only in the daemon's own
mount namespace; needs root, as a service's state directory on a read-only file system).

The daemon keeps protecting (a job is paused when the protected program works and resumed
after), status and ``explain`` say the state cannot be written (STATE_WRITE_FAILED, with a
remedy), and nothing recorded before is lost."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
from typing import Any

import psutil
import pytest

from arbiter_testing.node import PYTHON

from .conftest import Scene

FULL_AT = 32 * 1024


def still_protects(scene: Scene, name: str) -> None:
    """The protected program works: the job is paused; it stops: the job runs again."""
    scene.gpu(0.8)
    scene.held(name, "PROTECTED_GPU_BUSY")
    pid = scene.node.known_job(name)["pids"][0]
    scene.node.wait_for(lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED, timeout=30)
    scene.gpu(0.0)
    scene.node.wait_for(lambda: scene.node.known_job(name)["state"] == "run", timeout=30)
    scene.node.wait_for(lambda: psutil.Process(pid).status() != psutil.STATUS_STOPPED, timeout=30)


def timeline(scene: Scene) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = scene.node.call("timeline", limit=10_000)["events"]
    return events


def test_a_full_state_directory_stops_recording_not_protecting(scene: Scene) -> None:
    scene.protect()
    scene.start()
    scene.run_job("fleet")
    before = timeline(scene)
    assert any(e["code"] == "JOB_ADMITTED" for e in before)

    assert scene.node.daemon is not None
    daemon = psutil.Process(scene.node.daemon.pid)
    daemon.rlimit(psutil.RLIMIT_FSIZE, (FULL_AT, psutil.RLIM_INFINITY))
    scene.node.job_run([PYTHON, "-c", "pass"], "--name", "more")  # more to record
    scene.node.wait_for(lambda: scene.node.status()["recorder"]["failing_since"], timeout=60)
    still_protects(scene, "fleet")

    status = scene.node.status()
    assert status["recorder"]["failures"] > 0 and status["recorder"]["lost"] > 0
    notice = scene.explained("STATE_WRITE_FAILED")
    assert str(scene.node.state_dir) in notice["message"] and "free space" in notice["remedy"]
    assert any(n["code"] == "STATE_WRITE_FAILED" for n in status["notices"])
    scene.assert_alive()
    scene.assert_protected_untouched()

    daemon.rlimit(psutil.RLIMIT_FSIZE, (psutil.RLIM_INFINITY, psutil.RLIM_INFINITY))  # room again
    scene.node.job_run([PYTHON, "-c", "pass"], "--name", "after")  # its next write goes through
    back = scene.node.events("STATE_WRITE_FAILED", contains="it is written again")
    assert "lost" in back[-1]["message"]
    after = {e["id"]: e for e in timeline(scene)}
    assert all(after.get(e["id"]) == e for e in before), "an entry recorded before the disk filled is gone"
    assert scene.node.status()["recorder"]["failing_since"] is None
    assert not any(n["code"] == "STATE_WRITE_FAILED" for n in scene.node.status()["notices"])


def readonly_mount_works() -> str:
    """Why a read-only bind mount in a private mount namespace cannot be made here, or ""."""
    if os.geteuid() != 0:
        return "a read-only bind mount needs root (CAP_SYS_ADMIN) for its private mount namespace"
    if not shutil.which("unshare"):
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "true"], capture_output=True, text=True, check=False
    )
    return "" if probe.returncode == 0 else f"unshare -m is refused here: {probe.stderr.strip()}"


@pytest.mark.skipif(bool(readonly_mount_works()), reason=readonly_mount_works() or "-")
def test_a_read_only_state_database_keeps_protection_and_what_was_recorded(scene: Scene) -> None:
    scene.protect()
    scene.start()
    scene.run_job("fleet")
    scene.node.stop()  # a first run recorded things; then its state database turns read-only
    db = scene.node.state_dir / "state.db"
    with sqlite3.connect(db) as conn:
        kept = conn.execute("SELECT id, code, message FROM timeline ORDER BY id").fetchall()
    assert kept

    real_popen = subprocess.Popen

    def in_namespace(args: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        # only the daemon runs where the database is read-only; the test and CLI see it as is
        if args[1:3] == ["-m", "arbiter"] and args[3] == "run":
            script = 'mount --bind -o ro "$0" "$0" && exec "$@"'
            args = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, str(db), *args]
        return real_popen(args, **kw)

    subprocess.Popen = in_namespace  # type: ignore[assignment,misc]
    try:
        scene.node.start()
    finally:
        subprocess.Popen = real_popen  # type: ignore[misc]
    scene.node.wait_for(lambda: scene.node.status()["recorder"]["failing_since"], timeout=60)
    scene.node.wait_for(lambda: scene.rule()["running"], timeout=30)
    scene.run_job("again")
    still_protects(scene, "again")
    notice = scene.explained("STATE_WRITE_FAILED")
    assert "readonly" in notice["message"] or "read-only" in notice["message"], notice
    shown = [(e["id"], e["code"], e["message"]) for e in timeline(scene)]
    assert [tuple(k) for k in kept] == [s for s in shown if s[0] <= kept[-1][0]]  # readable, all of it
    scene.assert_alive()
    scene.assert_protected_untouched()
    scene.node.stop()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT id, code, message FROM timeline ORDER BY id").fetchall()[: len(kept)] == kept
