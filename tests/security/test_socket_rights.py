"""Socket rights (SPEC section 4) with a real second uid: anyone may read; only a job's
owner, root or the daemon's user act on a job; node-wide changes need root, the daemon's
user or the admin group; a session helper speaks only for its own uid's home.

The stop/pause/resume/reload cases are in tests/e2e/test_rights_and_reload.py; these are the
other operations."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from arbiter.api.transport import Connection, RequestRefused, request
from arbiter_testing import run_as
from arbiter_testing.node import PYTHON, HarnessNode


def as_nobody(sock: str, op: str, **args: Any) -> list[object]:
    """``op`` over the socket as the account nobody: [True, answer keys] or [False, code]."""

    def attempt() -> list[object]:
        try:
            return [True, sorted(request(sock, op, **args))]
        except RequestRefused as exc:
            return [False, exc.code]

    return run_as("nobody", attempt)  # type: ignore[no-any-return]


def helper_as_nobody(sock: str) -> list[object]:
    def attempt() -> list[object]:
        conn = Connection(sock)
        try:
            return [True, conn.call("helper.attach")]
        except RequestRefused as exc:
            return [False, exc.code, str(exc)]
        finally:
            conn.close()

    return run_as("nobody", attempt)  # type: ignore[no-any-return]


@pytest.mark.skipif(
    os.geteuid() != 0,
    reason="a second uid needs root (the rules are unit-tested in tests/e2e/test_rights_and_reload.py)",
)
def test_another_uid_reads_everything_and_changes_nothing_it_does_not_own() -> None:
    root = Path("/tmp") / f"arbiter-security-{os.getpid()}-{time.monotonic_ns()}"
    root.mkdir(mode=0o755)
    node = HarnessNode(root, admin_group="arbiter-no-such-group")
    try:
        node.add_rule(
            "prot",
            {
                "id": "prot",
                # no program here runs it; a plain arbiter.demo.protected could be a test's beside this one
                "match": {"cmdline": [f"arbiter.demo.protected --events {root / 'p.jsonl'}"]},
                "protect": {"metric": "gpu_share"},
            },
        )
        node.start()
        node.job_run([PYTHON, "-m", "arbiter.demo.job", "--plain"], "--name", "roots")
        job_id = node.wait_for(lambda: (node.job("roots") or {}).get("id"))
        node.wait_for(lambda: node.known_job("roots")["state"] == "run")
        sock = str(node.socket)

        reads: tuple[tuple[str, dict[str, object]], ...] = (
            ("status", {}),
            ("timeline", {}),
            ("explain", {}),
            ("duty", {}),
            ("certificates", {}),
            ("ab.status", {}),
            ("ping", {}),
        )
        for op, args in reads:
            assert as_nobody(sock, op, **args)[0] is True, op

        mine: tuple[tuple[str, dict[str, object]], ...] = (
            ("job.exited", {"exit_code": 0}),
            ("job.wait", {"timeout": 0.1}),
            ("job.started", {"pid": 1}),
        )
        for op, args in mine:
            assert as_nobody(sock, op, id=job_id, **args) == [False, "FORBIDDEN"], op
        for op in ("ab.start", "ab.sweep", "ab.plan", "ab.abort"):
            assert as_nobody(sock, op, rule="prot", id="ab-1") == [False, "FORBIDDEN"], op

        # nobody's home is not its own folder: it may speak for no source at all
        answer = helper_as_nobody(sock)
        assert answer[:2] == [False, "REFUSED"] and "no session helper for this account" in str(answer[2])

        # none of that touched the job: it still runs, and its owner still may act on it
        assert node.known_job("roots")["state"] == "run"
        assert not node.call("timeline", code="JOB_EXITED", subject=job_id)["events"]
        request(sock, "job.stop", id=job_id)
        node.wait_for(lambda: node.job("roots") is None, timeout=15)
    finally:
        node.close()
        shutil.rmtree(root, ignore_errors=True)
