"""Handing a running process over to the daemon as an outside scheduler's job (``job.adopt``)
with a real second uid: a user hands over only their own process, and only itself or its
parent (a scheduler's task hook is a child of its task); root names any process, and its word
wins over a job a user registered under the same id first."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from arbiter.api.transport import RequestRefused, request
from arbiter_testing import run_as
from arbiter_testing.node import HarnessNode

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="a second uid needs root"),
]


def adopt_as_nobody(sock: str, job_id: str, pid: int | None) -> list[object]:
    """``job.adopt`` as nobody, of ``pid`` (None: the asking process itself)."""

    def attempt() -> list[object]:
        try:
            answer = request(sock, "job.adopt", id=job_id, pid=pid or os.getpid())
            return [True, answer["job"]["id"], answer["new"]]
        except RequestRefused as exc:
            return [False, exc.code, str(exc)]

    return run_as("nobody", attempt)  # type: ignore[no-any-return]


def test_only_your_own_process_and_only_yourself_or_your_parent() -> None:
    root = Path("/tmp") / f"arbiter-adopt-{os.getpid()}-{time.monotonic_ns()}"
    root.mkdir(mode=0o755)
    node = HarnessNode(root)
    sleeper = subprocess.Popen(["sleep", "300"], user="nobody")
    try:
        node.start()
        sock = str(node.socket)
        # root's process (this test), nobody's other process: refused, and nothing registered
        assert adopt_as_nobody(sock, "batch-1", os.getpid())[:2] == [False, "FORBIDDEN"]
        refused = adopt_as_nobody(sock, "batch-1", sleeper.pid)
        assert refused[:2] == [False, "FORBIDDEN"] and "neither the caller nor" in str(refused[2]), refused
        assert not [j for j in node.status()["jobs"] if j["id"] == "batch-1"]
        # an id that is not <scheduler>-<id>
        assert adopt_as_nobody(sock, "Batch 1", None)[:2] == [False, "BAD_REQUEST"]

        # itself: taken on as a running job under the scheduler's id (it exits at once after)
        assert adopt_as_nobody(sock, "batch-2", None) == [True, "batch-2", True]

        # root hands over nobody's sleeper as batch-3, twice: one job
        first = request(sock, "job.adopt", id="batch-3", pid=sleeper.pid)
        again = request(sock, "job.adopt", id="batch-3", pid=sleeper.pid)
        assert first["new"] and not again["new"] and first["job"]["id"] == "batch-3"
        job = node.wait_for(lambda: next((j for j in node.status()["jobs"] if j["id"] == "batch-3"), None))
        assert job["state"] == "run", job
        events = node.events("JOB_ADOPTED", "batch-3", contains=f"process {sleeper.pid} of uid")
        assert len(events) == 1, events

        # a bad manifest is refused with what was wrong
        with pytest.raises(RequestRefused) as bad:
            request(sock, "job.adopt", id="batch-4", pid=sleeper.pid, manifest={"name": "no spaces allowed"})
        assert bad.value.code == "BAD_MANIFEST"
    finally:
        sleeper.kill()
        sleeper.wait()
        node.close()
    shutil.rmtree(root)  # after a failure it stays, with the daemon's log


def test_the_scheduler_word_wins_over_a_job_registered_first_under_its_id() -> None:
    root = Path("/tmp") / f"arbiter-adopt-{os.getpid()}-{time.monotonic_ns()}"
    root.mkdir(mode=0o755)
    node = HarnessNode(root)
    squatter = subprocess.Popen(["sleep", "300"], user="nobody")
    real = subprocess.Popen(["sleep", "300"])
    try:
        node.start()
        sock = str(node.socket)
        request(sock, "job.adopt", id="batch-9", pid=squatter.pid)
        answer = request(sock, "job.adopt", id="batch-9", pid=real.pid)
        assert answer["new"], answer
        job = node.wait_for(lambda: next((j for j in node.status()["jobs"] if j["id"] == "batch-9"), None))
        assert job["owner_uid"] == 0, job
        ended = node.events("JOB_EXITED", subject="batch-9")
        assert any(f"now process {real.pid}" in e["message"] for e in ended), ended
    finally:
        for proc in (squatter, real):
            proc.kill()
            proc.wait()
        node.close()
    shutil.rmtree(root)  # after a failure it stays, with the daemon's log


def test_an_account_never_takes_over_another_accounts_job() -> None:
    """``nobody`` hands over a process of its own under the id of root's running job: refused,
    and root's job keeps its process and its owner (before, it was ended and the id became
    nobody's, with the job's events file)."""
    root = Path("/tmp") / f"arbiter-adopt-{os.getpid()}-{time.monotonic_ns()}"
    root.mkdir(mode=0o755)
    node = HarnessNode(root)
    victim = subprocess.Popen(["sleep", "300"])
    try:
        node.start()
        sock = str(node.socket)
        # an id of the form a registration gives, and one of a scheduler's form
        for job_id in ("sleep-0a1b2c", "batch-11"):
            events = Path(request(sock, "job.adopt", id=job_id, pid=victim.pid)["job"]["events_path"])
            refused = adopt_as_nobody(sock, job_id, None)
            assert refused[:2] == [False, "FORBIDDEN"] and "belongs to uid 0" in str(refused[2]), refused
            job = next(j for j in node.status()["jobs"] if j["id"] == job_id)
            assert job["owner_uid"] == 0 and job["state"] == "run" and victim.pid in job["pids"], job
            assert not node.call("timeline", code="JOB_EXITED", subject=job_id)["events"], job_id
            assert events.stat().st_uid == 0
        # an id of nobody's own, or a free one, it may still hand over
        assert adopt_as_nobody(sock, "batch-12", None) == [True, "batch-12", True]
    finally:
        victim.kill()
        victim.wait()
        node.close()
    shutil.rmtree(root)  # after a failure it stays, with the daemon's log
