"""``opencl``: does an OpenCL platform offer a GPU device?

First the installable client drivers (ICDs) as the Linux ICD loader finds them: the ``*.icd``
files in ``/etc/OpenCL/vendors`` (``OPENCL_VENDOR_PATH`` replaces that folder; ``OCL_ICD_VENDORS``,
when set, replaces it with a folder, one ``.icd`` file or a library), plus the libraries in
``OCL_ICD_FILENAMES``.  Windows (registry) and macOS (a system framework) skip this step.  Then the
devices, from ``clinfo`` where it is installed, else from the ICD loader itself (in a child
process).  Only devices of type GPU count: a CPU device (PoCL) is named, not counted.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from arbiter_probes._host import HostProbe, ProbeOptions, ToolFailed, plural

DEFAULT_VENDORS = "/etc/OpenCL/vendors"


class OpenclOptions(ProbeOptions):
    kind: Literal["opencl"] = "opencl"


# --- ICDs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Icd:
    source: str  # the .icd file, or the variable that named the library
    library: str


def parse_icd_file(text: str) -> str | None:
    """The library an ``.icd`` file names (its first line), or None when it is empty."""
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return None


def _icd_files(folder: Path, shown: str) -> list[tuple[str, Path]]:
    try:
        files = sorted(p for p in folder.iterdir() if p.suffix == ".icd" and p.is_file())
    except OSError:
        return []
    return [(f"{shown.rstrip('/')}/{p.name}", p) for p in files]


def find_icds(env: Mapping[str, str], rooted: Callable[[str], Path] = Path) -> tuple[list[Icd], str]:
    """The ICDs the loader would load, and where it looked (for evidence)."""
    icds: list[Icd] = []
    files: list[tuple[str, Path]] = []
    vendors = env.get("OCL_ICD_VENDORS", "")
    vendor_path = env.get("OPENCL_VENDOR_PATH", "")
    if vendors:
        where = f"OCL_ICD_VENDORS={vendors}"
        if Path(vendors).is_dir():
            files = _icd_files(Path(vendors), vendors)
        elif vendors.endswith(".icd"):
            path = Path(vendors) if "/" in vendors else rooted(f"{DEFAULT_VENDORS}/{vendors}")
            files = [(vendors, path)] if path.is_file() else []
        else:
            icds.append(Icd("OCL_ICD_VENDORS", vendors))
    elif vendor_path:
        where = f"{vendor_path} (OPENCL_VENDOR_PATH)"
        files = _icd_files(Path(vendor_path), vendor_path)
    else:
        where = f"{DEFAULT_VENDORS} (OCL_ICD_VENDORS unset)"
        files = _icd_files(rooted(DEFAULT_VENDORS), DEFAULT_VENDORS)
    for shown, path in files:
        try:
            library = parse_icd_file(path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
        if library:
            icds.append(Icd(shown, library))
    icds.extend(Icd("OCL_ICD_FILENAMES", lib) for lib in env.get("OCL_ICD_FILENAMES", "").split(":") if lib)
    return icds, where


# --- devices -------------------------------------------------------------------------------------

_PAIR = re.compile(r"^(\S.*?)\s{2,}(\S.*?)\s*$")
_GPU = re.compile(r"\bGPU\b", re.IGNORECASE)
_CPU = re.compile(r"\bCPU\b", re.IGNORECASE)


def parse_clinfo(text: str) -> list[dict[str, Any]]:
    """Platforms of full ``clinfo`` output, each ``{"name", "devices": [{"name", "type"}]}``.

    The device part of the output repeats ``Platform Name`` right before ``Number of devices``;
    everything from ``NULL platform behavior`` on is about defaults and is not read.
    """
    platforms: list[dict[str, Any]] = []
    platform_name = ""
    current: dict[str, Any] | None = None
    device: dict[str, str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(("NULL platform behavior", "ICD loader properties")):
            break
        match = _PAIR.match(stripped)
        if not match:
            continue
        key, value = match.group(1), match.group(2)
        if key == "Platform Name":
            platform_name = value
        elif key == "Number of devices":
            current = {"name": platform_name, "devices": []}
            platforms.append(current)
            device = None
        elif current is not None and key == "Device Name":
            device = {"name": value}
            current["devices"].append(device)
        elif device is not None and key == "Device Type":
            device.setdefault("type", value)
    return platforms


def opencl_evidence(platforms: Sequence[Mapping[str, Any]], via: str) -> tuple[bool, str]:
    """Usable when a device's type is GPU; CPU devices (PoCL) and others are named, not counted."""
    gpus, cpus, others = [], [], []
    for platform in platforms:
        for device in platform.get("devices", []):
            kind = str(device.get("type", ""))
            words = f"{device.get('name', 'an unnamed device')} on {platform.get('name', 'an unnamed platform')}"
            if _GPU.search(kind):
                gpus.append(words)
            elif _CPU.search(kind):
                cpus.append(words)
            else:
                others.append(f"{words} ({kind or 'no type'})")
    if gpus:
        skipped = [f"{c}, a CPU device" for c in cpus] + [f"{o}, not a GPU" for o in others]
        counted = " and ".join(gpus) + f" through {via}"
        return True, counted + (f"; not counted: {'; '.join(skipped)}" if skipped else "")
    if cpus and not others:
        return False, f"only a CPU device: {cpus[0]}" if len(cpus) == 1 else f"only CPU devices: {', '.join(cpus)}"
    if cpus or others:
        return False, "no GPU device: " + ", ".join([f"{c} (CPU)" for c in cpus] + others)
    if not platforms:
        return False, f"{via} finds no OpenCL platform"
    listed = ", ".join(f"{p.get('name', '?')} with {plural(len(p.get('devices', [])), 'device')}" for p in platforms)
    return False, f"{via} lists no OpenCL device ({listed})"


def native_platforms(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The child's OpenCL report (see ``_native.query_opencl``) as clinfo-style platforms."""
    if report.get("error"):
        raise ToolFailed(str(report["error"]))
    return [dict(p) for p in report.get("platforms", [])]


class OpenclProbe(HostProbe):
    """Usable when an OpenCL platform lists a device of type GPU."""

    Options = OpenclOptions

    def check(self) -> tuple[bool, str]:
        icds: list[Icd] = []
        if self.platform not in ("win32", "darwin"):
            icds, where = find_icds(self.env, self.host_path)
            if not icds:
                return False, f"no OpenCL ICD in {where}"
        try:
            platforms = parse_clinfo(self.tool(["clinfo"]))
            via = "clinfo"
        except ToolFailed as exc:
            try:
                report = self.native("opencl")
                platforms = native_platforms(report)
            except ToolFailed as native_exc:
                return False, f"{exc}, and the ICD loader cannot be asked: {native_exc}{self._icds(icds)}"
            via = str(report.get("library", "the OpenCL ICD loader"))
        usable, evidence = opencl_evidence(platforms, via)
        has_devices = any(p.get("devices") for p in platforms)
        return usable, evidence + ("" if has_devices else self._icds(icds))

    @staticmethod
    def _icds(icds: Sequence[Icd]) -> str:
        if not icds:
            return ""
        return " (ICDs: " + ", ".join(f"{os.path.basename(i.source)} -> {i.library}" for i in icds) + ")"
