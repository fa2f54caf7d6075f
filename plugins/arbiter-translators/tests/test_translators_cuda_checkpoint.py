"""The ``cuda_checkpoint`` translator against real processes and a fake CUDA driver: a
library built from C with the driver's checkpoint calls, and a ``cuda-checkpoint`` utility
over it (no NVIDIA GPU here; bench/gpu_truth.py measures the real one)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from arbiter.plugin import JobTarget, PluginContext, ProcessRef
from arbiter_testing.fake_cuda import FakeCuda, build
from arbiter_testing.waiting import wait_until
from arbiter_translators import CudaCheckpointTranslator, arbiter_register_translators

Notes = list[tuple[str, str, str, dict[str, Any]]]


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fakecuda")
    return {"new": build(root / "new"), "old": build(root / "old", checkpoint=False, utility=False)}


@pytest.fixture
def cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    fake = FakeCuda(tmp_path / "driver")
    monkeypatch.setenv("FAKE_CUDA_DIR", str(fake.folder))
    return fake


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)


def start(procs: list[subprocess.Popen[bytes]]) -> ProcessRef:
    p = subprocess.Popen(["sleep", "60"])
    procs.append(p)
    return ProcessRef(p.pid, psutil.Process(p.pid).create_time())


def make(tmp_path: Path, notes: Notes, **options: Any) -> CudaCheckpointTranslator:
    context = PluginContext(state_dir=tmp_path, note=lambda *a: notes.append(a))
    return CudaCheckpointTranslator(CudaCheckpointTranslator.Options(**options), context)


def stopped(ref: ProcessRef) -> bool:
    return psutil.Process(ref.pid).status() == psutil.STATUS_STOPPED


def job(*refs: ProcessRef) -> JobTarget:
    return JobTarget("j1", "train", tuple(refs))


def test_registered() -> None:
    kinds: dict[str, type] = {}
    arbiter_register_translators(lambda name, cls: kinds.__setitem__(name, cls))
    assert kinds["cuda_checkpoint"] is CudaCheckpointTranslator
    assert CudaCheckpointTranslator.frees_vram and not CudaCheckpointTranslator.bounded


@pytest.mark.parametrize("backend", ["driver", "utility"])
def test_pause_checkpoints_before_stopping_and_resume_restores_after_continuing(
    backend: str,
    libs: dict[str, Path],
    cuda: FakeCuda,
    procs: list[subprocess.Popen[bytes]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", f"{libs['new'].parent}{os.pathsep}{os.environ['PATH']}")
    notes: Notes = []
    t = make(tmp_path, notes, backend=backend, library=str(libs["new"]))
    ok, why = t.available()
    assert ok and "checkpoint CUDA jobs" in why, why
    root, helper = start(procs), start(procs)
    cuda.uses_cuda(root.pid)  # the helper holds no CUDA state: it is only stopped
    paused = t.pause(job(root, helper))
    assert set(paused) == {root, helper}
    wait_until(lambda: stopped(root) and stopped(helper), 10, "both processes stopped")
    assert cuda.state(root.pid) == "checkpointed"
    steps = [(c.op, c.proc_state) for c in cuda.calls() if c.pid == root.pid]
    # the driver works on a thread of the job's own: it ran before the job was stopped
    assert [op for op, _ in steps] == ["lock", "checkpoint"] and all(s != "T" for _, s in steps), steps
    assert "VRAM released" in t.pause_effect([root]) and "stays allocated" not in t.pause_effect([root])
    assert [n[1] for n in notes] == ["GPU_MEMORY_CHECKPOINTED"] and notes[0][0] == "j1"

    cuda.clear_calls()
    t.resume([root, helper])
    wait_until(lambda: not stopped(root) and not stopped(helper), 10, "both processes continued")
    assert cuda.state(root.pid) == "running"
    steps = [(c.op, c.proc_state) for c in cuda.calls() if c.pid == root.pid]
    assert [op for op, _ in steps] == ["restore", "unlock"] and all(s != "T" for _, s in steps), steps
    assert notes[-1][1] == "GPU_MEMORY_RESTORED"
    # idempotent: a second pause finds it running again and checkpoints it again
    t.pause(job(root))
    assert cuda.state(root.pid) == "checkpointed"
    t.resume([root])
    t.resume([root])
    assert cuda.state(root.pid) == "running"


def test_unsupported_memory_falls_back_to_the_plain_pause_and_says_why(
    libs: dict[str, Path], cuda: FakeCuda, procs: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    notes: Notes = []
    t = make(tmp_path, notes, backend="driver", library=str(libs["new"]))
    ref = start(procs)
    cuda.uses_cuda(ref.pid, ["uvm"])
    assert t.pause(job(ref)) == [ref]
    wait_until(lambda: stopped(ref), 10, "the job stopped")
    assert cuda.state(ref.pid) == "locked"  # it submits no GPU work while paused
    effect = t.pause_effect([ref])
    assert "stays allocated" in effect and "CUDA_ERROR_NOT_SUPPORTED" in effect and "unified memory" in effect
    assert notes[-1][1] == "GPU_CHECKPOINT_FAILED" and notes[-1][3]["error"] == "CUDA_ERROR_NOT_SUPPORTED"
    t.resume([ref])
    wait_until(lambda: not stopped(ref), 10, "the job continued")
    assert cuda.state(ref.pid) == "running"


def test_a_lock_that_times_out_is_named_with_its_limit(
    libs: dict[str, Path], cuda: FakeCuda, procs: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    notes: Notes = []
    t = make(tmp_path, notes, backend="driver", library=str(libs["new"]), lock_timeout_ms=20)
    ref = start(procs)
    cuda.uses_cuda(ref.pid, ["busy"])
    t.pause(job(ref))
    wait_until(lambda: stopped(ref), 10, "the job stopped all the same")
    assert "lock_timeout_ms 20" in t.pause_effect([ref]) and "CUDA_ERROR_TIMEOUT" in t.pause_effect([ref])
    assert cuda.state(ref.pid) == "running"
    t.resume([ref])


def test_a_driver_without_the_checkpoint_calls_pauses_with_signals(
    libs: dict[str, Path],
    cuda: FakeCuda,
    procs: list[subprocess.Popen[bytes]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FAKE_CUDA_VERSION", "12040")
    t = make(tmp_path, [], backend="driver", library=str(libs["old"]))
    ok, why = t.available()
    assert ok and "CUDA 12.4" in why and "cuCheckpointProcessGetState" in why and "signals only" in why, why
    ref = start(procs)
    cuda.uses_cuda(ref.pid)
    t.pause(job(ref))
    wait_until(lambda: stopped(ref), 10, "the job stopped")
    assert cuda.state(ref.pid) == "running" and cuda.calls() == []
    assert "stays allocated" in t.pause_effect([ref]) and "CUDA 12.4" in t.pause_effect([ref])
    t.resume([ref])
    wait_until(lambda: not stopped(ref), 10, "the job continued")


def test_no_driver_at_all_is_said_plainly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no cuda-checkpoint either
    t = make(tmp_path, [], library=str(tmp_path / "libcuda.so.1"))
    ok, why = t.available()
    assert ok and "cannot be loaded" in why and "no cuda-checkpoint on PATH" in why, why


def test_a_restored_process_is_checkpointed_again_before_it_is_killed(
    libs: dict[str, Path], cuda: FakeCuda, procs: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    t = make(tmp_path, [], backend="driver", library=str(libs["new"]))
    ref, other = start(procs), start(procs)
    cuda.uses_cuda(ref.pid)
    cuda.uses_cuda(other.pid)  # never restored: killed as it is
    t.pause(job(ref))
    t.resume([ref])
    held = start(procs)
    cuda.uses_cuda(held.pid)
    t.pause(job(held))
    # a daemon started again knows what the last one restored, and what a pause it made freed
    again = make(tmp_path, [], backend="driver", library=str(libs["new"]))
    assert "VRAM released" in again.pause_effect([held])
    cuda.clear_calls()
    again.kill(job(ref, other))
    wait_until(lambda: procs[0].poll() is not None and procs[1].poll() is not None, 10, "both killed")
    assert [(c.op, c.pid) for c in cuda.calls()] == [("lock", ref.pid), ("checkpoint", ref.pid)]
    assert cuda.state(ref.pid) == "checkpointed"


def test_a_toggling_utility_checkpoints_and_restores(
    libs: dict[str, Path], cuda: FakeCuda, procs: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    # driver 550's utility has --toggle but no --action
    old = tmp_path / "bin" / "cuda-checkpoint"
    old.parent.mkdir()
    text = (libs["new"].parent / "cuda-checkpoint").read_text().replace("--action lock", "(no actions)")
    old.write_text(text)
    old.chmod(0o755)
    t = make(tmp_path, [], backend="utility", utility=str(old))
    assert t.driver is not None and not getattr(t.driver, "actions", True)
    ref = start(procs)
    cuda.uses_cuda(ref.pid)
    t.pause(job(ref))
    assert cuda.state(ref.pid) == "checkpointed"
    t.resume([ref])
    assert cuda.state(ref.pid) == "running"
