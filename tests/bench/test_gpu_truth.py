"""bench/gpu_truth.py in its dry run: NVML simulated, the fake CUDA driver library, a CPU
core for the GPU.  The figures mean nothing here; what is checked is that every part runs,
is kept as soon as it is done, is skipped when run again, and that nothing can change a
device's settings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from arbiter_testing.fake_nvml import FakePynvmlBase
from arbiter_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_truth.py"


def run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.timeout(400)
def test_the_dry_run_measures_each_part_keeps_it_and_skips_it_next_time(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = run("--dry-run", "--out", str(out), "--parts", "pause,checkpoint,handoff", timeout=360)
    print(first.stdout[-4000:], first.stderr[-2000:])
    assert first.returncode == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["device"]["dry_run"] == "True" and set(doc["parts"]) == {"pause", "checkpoint", "handoff"}
    handoff = doc["parts"]["handoff"]["figures"]
    assert (
        handoff["freed_bytes"] > 0 and handoff["job_checkpoint_s"] is not None and handoff["job_restore_s"] is not None
    )
    pauses = {r["translator"]: r for r in doc["parts"]["pause"]["figures"]["rows"]}
    assert set(pauses) == {"control_doc", "signal", "cgroup_freeze", "cuda_checkpoint"}
    # only the checkpoint gives the (stand-in) VRAM back
    assert pauses["cuda_checkpoint"]["vram_paused"] == 0 and pauses["signal"]["vram_paused"] > 0
    check = doc["parts"]["checkpoint"]["figures"]
    assert check["losses_bitwise_equal"] and check["vram_paused"] == 0 and check["vram_after_restore"] > 0
    report = (out / "report.md").read_text()
    assert "DRY RUN" in report and "## readers" in report and "not run yet" in report

    again = run("--dry-run", "--out", str(out), "--parts", "checkpoint")
    assert again.returncode == 0 and "checkpoint: done at" in again.stdout and "kept" in again.stdout


def test_it_refuses_to_apply_a_profile(tmp_path: Path) -> None:
    refused = run("--dry-run", "--out", str(tmp_path), "--apply-profile", "llm-server", timeout=60)
    assert refused.returncode != 0 and "never changes the GPU's settings" in refused.stderr


def test_every_nvml_call_that_changes_a_device_is_refused() -> None:
    dry = load_script(ROOT / "bench" / "gpu_truth_dry.py", "gpu_truth_dry")
    nvml = dry.ReadOnlyNvml(FakePynvmlBase([object()]))
    assert nvml.nvmlDeviceGetCount() == 1
    for call in (
        "nvmlDeviceSetPowerManagementLimit",
        "nvmlDeviceSetGpuLockedClocks",
        "nvmlDeviceResetGpuLockedClocks",
        "nvmlDeviceSetComputeMode",
        "nvmlDeviceSetMigMode",
        "nvmlDeviceSetPersistenceMode",
    ):
        with pytest.raises(dry.DeviceChangeRefused, match="only reads the device"):
            getattr(nvml, call)
