"""Attacks on the operations table by another account, each through the daemon's own table
with a real process of that account (the socket's peer credentials are what `dispatch` is
given): a job's name never lets one account act on another's job, a handed-over process
counts against its account's quotas, an ended job's id stays its owner's, and a request's
numbers and ids are refused, not failed on."""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Iterator

import pytest

from arbiter.daemon.core import Daemon

from .conftest import StartDaemon, needs_root

pytestmark = [pytest.mark.slow, needs_root]
NOBODY = pwd.getpwnam("nobody").pw_uid


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    made: list[subprocess.Popen[bytes]] = []
    yield made
    for proc in made:
        proc.kill()
        proc.wait()


def nobody_sleeping(sleepers: list[subprocess.Popen[bytes]]) -> int:
    proc = subprocess.Popen(["sleep", "300"], user="nobody")
    sleepers.append(proc)
    return proc.pid


def adopt_as_nobody(daemon: Daemon, job_id: str, pid: int) -> dict[str, object]:
    """``job.adopt`` of nobody's process ``pid``, asked by that process itself."""
    return daemon.api.dispatch("job.adopt", {"id": job_id, "pid": pid}, (pid, NOBODY))


def register_as_root(daemon: Daemon, name: str) -> str:
    answer = daemon.api.dispatch(
        "job.register", {"cmd": ["true"], "manifest": {"name": name, "gpu": {"use": "none"}}}, (os.getpid(), 0)
    )
    assert answer["ok"], answer
    return str(answer["job"]["id"])


def test_a_name_or_an_id_another_account_chose_never_stands_in_for_your_job(
    start_daemon: StartDaemon, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    daemon = start_daemon()
    mine = register_as_root(daemon, "llm-serve")
    # nobody hands over its own process under the name root's job goes by, as an id
    assert adopt_as_nobody(daemon, "llm-serve", nobody_sleeping(sleepers))["ok"]
    answer = daemon.api.dispatch("job.pause", {"id": "llm-serve"}, (os.getpid(), 0))
    assert answer["ok"] and answer["job"] == mine, answer
    assert daemon.jobs.get(mine).user_hold  # type: ignore[union-attr]
    assert not daemon.jobs.get("llm-serve").user_hold  # type: ignore[union-attr]


def test_a_job_of_the_same_name_by_another_account_does_not_block_yours(
    start_daemon: StartDaemon, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    daemon = start_daemon()
    mine = register_as_root(daemon, "train")
    pid = nobody_sleeping(sleepers)
    theirs = daemon.api.dispatch(
        "job.register", {"cmd": ["true"], "manifest": {"name": "train", "gpu": {"use": "none"}}}, (pid, NOBODY)
    )
    assert theirs["ok"], theirs
    answer = daemon.api.dispatch("job.stop", {"id": "train"}, (os.getpid(), 0))
    assert answer["ok"] and answer["job"] == mine, answer


def test_handed_over_processes_count_against_the_accounts_jobs(
    start_daemon: StartDaemon, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    daemon = start_daemon(quotas={"jobs_per_uid": 1})
    first = nobody_sleeping(sleepers)
    assert adopt_as_nobody(daemon, "batch-0", first)["ok"]
    assert adopt_as_nobody(daemon, "batch-0", first)["ok"], "the same hand-over again is no new job"
    refused = adopt_as_nobody(daemon, "batch-1", nobody_sleeping(sleepers))
    assert refused["ok"] is False and refused["code"] == "QUOTA", refused


def test_an_ended_jobs_id_stays_its_owners(start_daemon: StartDaemon, sleepers: list[subprocess.Popen[bytes]]) -> None:
    daemon = start_daemon()
    ended = register_as_root(daemon, "batch")
    assert daemon.api.dispatch("job.exited", {"id": ended, "exit_code": 0}, (os.getpid(), 0))["ok"]
    refused = adopt_as_nobody(daemon, ended, nobody_sleeping(sleepers))
    assert refused["ok"] is False and refused["code"] == "FORBIDDEN", refused
    assert daemon.jobs.held_by(ended) == 0  # its folder is still root's


@pytest.mark.parametrize("value", [10**400, -(10**400)])
def test_a_number_too_large_for_a_float_is_refused_by_name(start_daemon: StartDaemon, value: int) -> None:
    answer = start_daemon().api.dispatch("timeline", {"limit": value}, (os.getpid(), NOBODY))
    assert answer["ok"] is False and answer["code"] == "BAD_REQUEST" and "'limit'" in str(answer["error"])


def test_an_id_ending_in_a_line_break_is_no_scheduler_id(
    start_daemon: StartDaemon, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    refused = adopt_as_nobody(start_daemon(), "batch-1\n", nobody_sleeping(sleepers))
    assert refused["ok"] is False and refused["code"] == "BAD_REQUEST", refused
