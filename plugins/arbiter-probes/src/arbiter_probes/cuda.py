"""``cuda``: is there an NVIDIA GPU the CUDA driver can use?

Asks NVML (``libnvidia-ml.so.1`` / ``nvml.dll``) for its device count and names; where NVML is
missing or finds none, asks the driver library itself (``libcuda.so.1`` / ``nvcuda.dll``):
``cuInit`` then ``cuDeviceGetCount``.  Both run through ctypes in a child process, so a broken
driver cannot hang or crash the caller.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from arbiter_probes._host import HostProbe, ProbeOptions, ToolFailed, plural


class CudaOptions(ProbeOptions):
    kind: Literal["cuda"] = "cuda"


def cuda_version_words(version: object) -> str | None:
    """``12040`` (as ``cuDriverGetVersion`` gives it) as ``12.4``."""
    if not isinstance(version, int) or version <= 0:
        return None
    return f"{version // 1000}.{version % 1000 // 10}"


def _devices_words(devices: Sequence[str]) -> str:
    if len(devices) == 1:
        return devices[0]
    return f"{plural(len(devices), 'GPU')}: " + ", ".join(devices)


def cuda_evidence(report: Mapping[str, Any]) -> tuple[bool, str]:
    """Decide from the child's report (see ``_native.query_cuda``)."""
    if report.get("error"):
        return False, f"the NVIDIA driver query failed: {report['error']}"
    nvml = report.get("nvml") or {}
    driver = report.get("cuda") or {}
    if nvml.get("devices"):
        words = f"{_devices_words(nvml['devices'])} through {nvml.get('library', 'NVML')}"
        details = []
        if nvml.get("driver"):
            details.append(f"driver {nvml['driver']}")
        cuda = cuda_version_words(nvml.get("cuda_version"))
        if cuda:
            details.append(f"CUDA {cuda}")
        return True, words + (", " + " ".join(details) if details else "")
    if driver.get("devices"):
        words = f"{_devices_words(driver['devices'])} through {driver.get('library', 'the CUDA driver')}"
        version = cuda_version_words(driver.get("cuda_version"))
        return True, words + (f", driver {version}" if version else "")
    reasons = []
    for part in (nvml, driver):
        if not part:
            continue
        if part.get("error"):
            reasons.append(part["error"])
        elif "devices" in part:
            reasons.append(f"{part.get('library', '?')} finds no GPU")
    if not reasons:
        return False, "no NVIDIA driver library answered"
    if all(r.endswith(" not found") for r in reasons):
        return False, "no NVIDIA driver: " + " and ".join(r.removesuffix(" not found") for r in reasons) + " not found"
    return False, "; ".join(reasons)


class CudaProbe(HostProbe):
    """Usable when NVML or the CUDA driver library counts at least one GPU."""

    Options = CudaOptions

    def check(self) -> tuple[bool, str]:
        try:
            report = self.native("cuda")
        except ToolFailed as exc:
            return False, f"the NVIDIA driver query failed: {exc}"
        return cuda_evidence(report)
