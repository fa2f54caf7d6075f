"""End to end: a daemon whose pause translator is ``cuda_checkpoint``, over the fake CUDA
driver library (found as ``libcuda.so.1`` on the daemon's library path, as the real one is):
a job is checkpointed before it is stopped, explain says its VRAM was released, and it is
restored after it is continued; a tenant short of VRAM takes it from a job that way."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from arbiter_testing.fake_cuda import FakeCuda, build
from arbiter_testing.node import PYTHON, HarnessNode
from arbiter_testing.vram_board import GIB, VramBoard
from arbiter_testing.waiting import wait_until

from .conftest import Procs

RUNNING = {"running", "sleeping", "disk-sleep"}


def start_protected(node: HarnessNode) -> subprocess.Popen[bytes]:
    return node.spawn([PYTHON, "-m", "arbiter.demo.protected", "--events", str(node.root / "p.jsonl")])


def test_a_paused_cuda_job_gives_its_vram_back_and_gets_it_again(tmp_path: Path, procs: type[Procs]) -> None:
    library = build(tmp_path / "lib", utility=False)
    cuda = FakeCuda(tmp_path / "driver")
    node = HarnessNode(tmp_path, translators={"pause": ["cuda_checkpoint"], "terminate": ["cuda_checkpoint"]})
    try:
        marker = f"arbiter.demo.protected --events {node.root / 'p.jsonl'}"  # this test's stand-in only
        node.add_rule(
            "prot", {"id": "prot", "priority": 50, "match": {"cmdline": [marker]}, "protect": {"metric": "gpu_share"}}
        )
        node.start(timeout=30.0, LD_LIBRARY_PATH=str(library.parent), **cuda.env)
        node.job_run([PYTHON, "-m", "arbiter.demo.job", "--plain"], "--name", "trainer")
        pid = node.job_pid("trainer")
        cuda.uses_cuda(pid)
        protected = start_protected(node)
        procs.wait(pid, {"stopped"}, timeout=30)
        event = node.events("GPU_MEMORY_CHECKPOINTED")[0]
        assert [c.op for c in cuda.calls() if c.pid == pid][:2] == ["lock", "checkpoint"]
        out = node.cli("explain", "trainer", "--json", timeout=30, check=True)
        (item,) = json.loads(out.stdout)["items"]
        assert event["subject"] == item["id"]
        assert item["state"] == "paused" and "VRAM released" in item["pause_effect"], item
        shown = node.cli("explain", "trainer", timeout=30, check=True).stdout
        assert "its pause: its CUDA work was locked and checkpointed" in " ".join(shown.split())
        protected.terminate()
        protected.wait()
        procs.wait(pid, RUNNING, timeout=30)
        wait_until(lambda: cuda.state(pid) == "running", 30, "the job's CUDA state restored and unlocked")
        node.events("GPU_MEMORY_RESTORED", subject=item["id"])
        ops = [c.op for c in cuda.calls() if c.pid == pid]
        # a busy machine may see the protected program pause and resume it more than once
        assert ops and ops == ["lock", "checkpoint", "restore", "unlock"] * (len(ops) // 4), ops
        assert all(c.proc_state != "T" for c in cuda.calls()), "the driver was called while the job was stopped"
    finally:
        node.close()


def test_a_tenant_short_of_vram_takes_it_from_a_job_by_checkpointing_it(tmp_path: Path, procs: type[Procs]) -> None:
    library = build(tmp_path / "lib", utility=False)
    cuda = FakeCuda(tmp_path / "driver")
    board = VramBoard(tmp_path / "vram.json", 24 * GIB)
    node = HarnessNode(
        tmp_path,
        readers=[{"kind": "fake", "state_file": str(board.path), "cuda_dir": str(cuda.folder)}],
        stand_in_gpu=False,
        translators={"pause": ["cuda_checkpoint"], "terminate": ["cuda_checkpoint"]},
    )
    try:
        marker = f"render-stand-in {tmp_path}"
        node.add_rule("render", {"id": "render", "priority": 60, "match": {"cmdline": [marker]}, "needs_vram_gb": 12})
        node.start(timeout=30.0, LD_LIBRARY_PATH=str(library.parent), **cuda.env)
        node.job_run([PYTHON, "-c", "import time; time.sleep(300)"], "--name", "trainer")
        pid = node.job_pid("trainer")
        cuda.uses_cuda(pid)
        board.set(pid, 20 * GIB, 0.5)
        render = node.spawn([PYTHON, "-c", "import time; time.sleep(300)", marker])
        board.set(render.pid, 1 * GIB, 0.5)  # busy, and short: 1 held + 3 free < 12
        procs.wait(pid, {"stopped"}, timeout=30)
        released = node.events("VRAM_RELEASED", subject=node.known_job("trainer")["id"])[-1]
        assert released["data"]["freed_bytes"] == 20 * GIB and cuda.state(pid) == "checkpointed"
        job = node.known_job("trainer")
        reasons = node.call("explain", subject="trainer")["explain"]["items"][0]["reasons"]
        why = next(r for r in reasons if r["code"] == "JOB_PAUSED_FOR_VRAM")
        assert job["state"] == "paused" and "'render'" in why["message"], reasons
        board.set(render.pid, 1 * GIB, 0.0)  # idle now: the job may have its memory back
        procs.wait(pid, RUNNING, timeout=30)
        wait_until(lambda: cuda.state(pid) == "running", 30, "the job restored")
    finally:
        node.close()
