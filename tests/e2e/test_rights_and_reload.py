"""Socket rights with a real second uid, and rule files changed under a running daemon."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from arbiter.api.transport import RequestRefused, request
from arbiter.daemon.operation import may_act_on_job, may_admin
from arbiter_testing import run_as
from arbiter_testing.node import PYTHON, HarnessNode


def test_rights_rules() -> None:
    assert may_act_on_job(1000, owner_uid=1000, daemon_uid=0)
    assert may_act_on_job(0, owner_uid=1000, daemon_uid=500)
    assert may_act_on_job(500, owner_uid=1000, daemon_uid=500)
    assert not may_act_on_job(1001, owner_uid=1000, daemon_uid=500)
    assert may_admin(1001, daemon_uid=500, admin_uids={1001}) and not may_admin(1002, daemon_uid=500, admin_uids={1001})


def as_nobody(fn: Callable[[], Any]) -> tuple[bool, str]:
    """Call ``fn`` as the account nobody: (True, "ok") or (False, the refusal's code)."""

    def attempt() -> list[object]:
        try:
            fn()
        except RequestRefused as exc:
            return [False, exc.code]
        return [True, "ok"]

    ok, detail = run_as("nobody", attempt)
    return ok, detail


def marker(node: HarnessNode) -> str:
    """The protected program's command line, this test's own: no program here runs it, and
    one matched by a plain ``arbiter.demo.protected`` could be a stand-in of a test beside it."""
    return f"arbiter.demo.protected --events {node.root / 'p.jsonl'}"


def good(node: HarnessNode) -> str:
    return f"id: prot\nmatch: {{cmdline: ['{marker(node)}']}}\nprotect: {{metric: gpu_share}}\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="a second uid needs root; the rights rules are tested above")
def test_another_uid_can_read_but_cannot_stop_or_resume_a_job_it_does_not_own(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = Path("/tmp") / f"arbiter-rights-{os.getpid()}-{time.monotonic_ns()}"
    root.mkdir(mode=0o755)
    node = HarnessNode(root)
    try:
        node.add_rule("prot", {"id": "prot", "match": {"cmdline": [marker(node)]}, "protect": {"metric": "gpu_share"}})
        node.start()
        assert stat.S_IMODE(os.stat(node.socket).st_mode) == 0o666
        node.job_run([PYTHON, "-m", "arbiter.demo.job", "--plain"], "--name", "mine")
        job_id = node.wait_for(lambda: (node.job("mine") or {}).get("id"))
        sock = str(node.socket)
        assert as_nobody(lambda: request(sock, "status")) == (True, "ok")
        for op in ("job.stop", "job.pause", "job.resume"):
            assert as_nobody(partial(request, sock, op, id=job_id)) == (False, "FORBIDDEN"), op
        assert as_nobody(lambda: request(sock, "reload")) == (False, "FORBIDDEN")
        node.wait_for(lambda: node.known_job("mine")["state"] == "run")
        # the owner (root here) may
        request(sock, "job.pause", id=job_id)
        node.wait_for(lambda: node.known_job("mine")["state"] == "paused")
        assert node.known_job("mine")["reasons"][0]["code"] == "JOB_HELD_BY_USER"
        request(sock, "job.resume", id=job_id)
        node.wait_for(lambda: node.known_job("mine")["state"] == "run")
        request(sock, "job.stop", id=job_id)
        node.wait_for(lambda: node.job("mine") is None, timeout=10)
    finally:
        node.close()
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def test_bad_edit_keeps_last_good_version_and_never_valid_file_holds_gpu_work(tmp_path: Path) -> None:
    node = HarnessNode(tmp_path)
    try:
        path = node.add_rule("prot", good(node))
        node.start()
        node.job_run([PYTHON, "-m", "arbiter.demo.job", "--plain"], "--name", "plain")
        node.wait_for(lambda: (node.job("plain") or {}).get("state") == "run")

        node.add_rule("prot", good(node).replace("protect: {metric: gpu_share}", "protect: {metric: gpu_shares}"))
        node.wait_for(lambda: node.status()["problems"].get(str(path)))
        status = node.status()
        assert [r["id"] for r in status["rules"]] == ["prot"] and status["rules"][0]["protected"]
        assert status["invalid_files"] == []
        node.wait_for(lambda: node.known_job("plain")["state"] == "run")
        rejected = node.events("CONFIG_REJECTED", contains="kept the last good version")
        assert "kept the last good version" in rejected[-1]["message"] and ":3:" in rejected[-1]["message"]

        node.add_rule("other", "id: other\nmatch: {nmae: [x]}\n")
        node.wait_for(lambda: node.known_job("plain")["state"] == "paused")
        reason = node.known_job("plain")["reasons"][0]
        assert reason["code"] == "CONFIG_REJECTED" and "arbiter check" in reason["remedy"]

        (node.tenants / "other.yaml").unlink()
        node.add_rule("prot", good(node).replace("id: prot", "id: prot\npriority: 70"))
        node.wait_for(lambda: node.known_job("plain")["state"] == "run")
        assert node.status()["rules"][0]["priority"] == 70
        assert node.status()["problems"] == {}
    finally:
        node.close()


def test_a_restarted_daemon_uses_the_last_good_version(tmp_path: Path) -> None:
    node = HarnessNode(tmp_path)
    try:
        node.add_rule("prot", good(node))
        node.start()
        node.wait_for(lambda: node.status()["rules"])
        node.stop()
        node.add_rule("prot", good(node) + "colour: red\n")
        node.start()
        status = node.status()
        assert [r["id"] for r in status["rules"]] == ["prot"] and status["invalid_files"] == []
        assert "colour" in status["problems"][str(node.tenants / "prot.yaml")][0]
    finally:
        node.close()


def test_only_a_child_of_the_launcher_can_become_the_job(tmp_path: Path) -> None:
    import subprocess

    node = HarnessNode(tmp_path)
    try:
        node.start()
        job = node.call("job.register", manifest={"name": "sneaky"}, cmd=["true"])["job"]
        stranger = subprocess.Popen(["sleep", "30"], start_new_session=True)  # a child of the test, not of a launcher
        try:
            with pytest.raises(RequestRefused) as err:
                node.call("job.started", id=job["id"], pid=1)
            assert err.value.code == "FORBIDDEN"
        finally:
            stranger.kill()
            stranger.wait()
        # the registering process is the launcher: its own child may start the job, once
        child = subprocess.Popen(["sleep", "30"])
        try:
            node.call("job.started", id=job["id"], pid=child.pid)
            with pytest.raises(RequestRefused):
                node.call("job.started", id=job["id"], pid=child.pid)
        finally:
            child.kill()
            child.wait()
    finally:
        node.close()


def test_a_job_stopped_before_it_started_cannot_start(tmp_path: Path) -> None:
    import subprocess

    node = HarnessNode(tmp_path)
    try:
        node.start()
        job = node.call("job.register", manifest={"name": "late"}, cmd=["true"])["job"]
        assert node.call("job.stop", id=job["id"])["did"] == "stopped before it started"
        child = subprocess.Popen(["sleep", "30"])
        try:
            with pytest.raises(RequestRefused, match="no running job"):
                node.call("job.started", id=job["id"], pid=child.pid)
        finally:
            child.kill()
            child.wait()
    finally:
        node.close()


def test_a_job_whose_gpu_apis_the_host_lacks_is_refused_as_undetected(tmp_path: Path) -> None:
    import subprocess

    from arbiter_testing.node import PYTHON, HarnessNode

    node = HarnessNode(tmp_path)
    try:
        node.start()
        if "cuda" in node.call("gpu-apis", timeout=60)["gpu_apis"]["host"]:
            import pytest

            pytest.skip("this host has CUDA")
        manifest = tmp_path / "cuda.yaml"
        manifest.write_text("name: needs-cuda\ngpu: {use: shared, apis_any: [cuda]}\n")
        launcher = node.job_run(
            [PYTHON, "-c", "print('ran')"], "--manifest", str(manifest), stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 69 and b"ran" not in out
        assert b"GPU_API_UNAVAILABLE" in err and b"undetected" in err and b"cuda" in err
        assert not node.status()["jobs"]
    finally:
        node.close()
