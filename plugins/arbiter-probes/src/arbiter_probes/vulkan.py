"""``vulkan``: does the Vulkan loader find a real GPU?

First the driver manifests, where the loader looks for them (Linux and macOS; Windows keeps them in
the registry): ``VK_DRIVER_FILES`` (or the older ``VK_ICD_FILENAMES``) replaces the search, each
entry a manifest or a folder of them; otherwise ``VK_ADD_DRIVER_FILES`` and then ``vulkan/icd.d``
under ``$XDG_CONFIG_HOME``, ``$XDG_CONFIG_DIRS``, ``/usr/local/etc``, ``/etc``, ``$XDG_DATA_HOME``
and ``$XDG_DATA_DIRS`` (each with the loader's fallback when unset).  Then the devices, from
``vulkaninfo --summary`` where it is installed, else from the loader library itself (in a child
process).  A ``PHYSICAL_DEVICE_TYPE_CPU`` device (lavapipe's llvmpipe, SwiftShader) does not count.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from arbiter_probes._host import HostProbe, ProbeOptions, ToolFailed

CPU_TYPE = "PHYSICAL_DEVICE_TYPE_CPU"
GPU_TYPES = {
    "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU": "discrete GPU",
    "PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU": "integrated GPU",
    "PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU": "virtual GPU",
}


class VulkanOptions(ProbeOptions):
    kind: Literal["vulkan"] = "vulkan"


# --- where the loader looks ------------------------------------------------------------------------


@dataclass(frozen=True)
class SearchPlan:
    """Where the loader would look: ``entries`` are (as shown, path on this host) pairs."""

    entries: tuple[tuple[str, Path], ...]
    override: str | None  # the variable that replaced the default search, if one did

    def words(self) -> str:
        return ", ".join(shown for shown, _ in self.entries)


def _split(value: str, windows: bool) -> list[str]:
    return [part for part in value.split(";" if windows else ":") if part]


def search_plan(env: Mapping[str, str], rooted: Callable[[str], Path] = Path, windows: bool = False) -> SearchPlan:
    """The loader's manifest search for ``env``; ``rooted(path)`` places a built-in path on the host."""
    for variable in ("VK_DRIVER_FILES", "VK_ICD_FILENAMES"):
        entries = _split(env.get(variable, ""), windows)
        if entries:
            return SearchPlan(tuple((e, Path(e)) for e in entries), variable)
    found: list[tuple[str, Path]] = [(e, Path(e)) for e in _split(env.get("VK_ADD_DRIVER_FILES", ""), windows)]
    home = env.get("HOME", "").rstrip("/")

    def add(variable: str, fallback: Sequence[str], fixed: bool) -> None:
        """``vulkan/icd.d`` under each folder of ``variable``, or under its fallback folders.

        Folders from the environment (and from ``$HOME``) are used as given; ``fixed`` fallbacks
        are built-in locations, placed on the host by ``rooted``.
        """
        value = env.get(variable, "")
        for folder in _split(value, False) if value else fallback:
            shown = f"{folder.rstrip('/')}/vulkan/icd.d"
            found.append((shown, rooted(shown) if fixed and not value else Path(shown)))

    add("XDG_CONFIG_HOME", [f"{home}/.config"] if home else [], fixed=False)
    add("XDG_CONFIG_DIRS", ["/etc/xdg"], fixed=True)
    for shown in ("/usr/local/etc/vulkan/icd.d", "/etc/vulkan/icd.d"):  # SYSCONFDIR, EXTRASYSCONFDIR
        found.append((shown, rooted(shown)))
    add("XDG_DATA_HOME", [f"{home}/.local/share"] if home else [], fixed=False)
    add("XDG_DATA_DIRS", ["/usr/local/share", "/usr/share"], fixed=True)
    unique: dict[str, Path] = {}
    for shown, path in found:
        unique.setdefault(shown, path)
    return SearchPlan(tuple(unique.items()), None)


@dataclass(frozen=True)
class DriverManifest:
    path: str
    library: str
    api_version: str = ""


def parse_driver_manifest(text: str) -> tuple[str, str]:
    """(library_path, api_version) of a driver manifest; ``ValueError`` when it is not one."""
    try:
        data = json.loads(text)
    except ValueError:
        raise ValueError("not valid JSON") from None
    icd = data.get("ICD") if isinstance(data, dict) else None
    if not isinstance(icd, dict) or not isinstance(icd.get("library_path"), str):
        raise ValueError("no ICD.library_path")
    return icd["library_path"], str(icd.get("api_version", ""))


def find_manifests(plan: SearchPlan) -> tuple[list[DriverManifest], list[str]]:
    """The driver manifests the plan finds, and the problems met (a missing file, a bad manifest)."""
    manifests: list[DriverManifest] = []
    problems: list[str] = []
    for shown, path in plan.entries:
        if path.is_dir():
            try:
                files = sorted(p for p in path.iterdir() if p.suffix == ".json" and p.is_file())
            except OSError:
                continue
            candidates = [(f"{shown.rstrip('/')}/{p.name}", p) for p in files]
        elif path.is_file():
            candidates = [(shown, path)]
        else:
            if plan.override:
                problems.append(f"{shown} does not exist")
            continue
        for name, file in candidates:
            try:
                library, api = parse_driver_manifest(file.read_text(encoding="utf-8", errors="replace"))
            except (OSError, ValueError) as exc:
                problems.append(f"{name}: {exc}")
                continue
            manifests.append(DriverManifest(name, library, api))
    return manifests, problems


# --- devices -------------------------------------------------------------------------------------

_GPU_HEADER = re.compile(r"^GPU\s*(\d+)\s*:\s*$")


def parse_vulkaninfo_summary(text: str) -> list[dict[str, str]]:
    """The ``Devices:`` section of ``vulkaninfo --summary``: one ``{field: value}`` per ``GPUn:``."""
    devices: list[dict[str, str]] = []
    in_devices = False
    current: dict[str, str] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not in_devices:
            in_devices = line == "Devices:"
            continue
        if _GPU_HEADER.match(line):
            current = {}
            devices.append(current)
        elif current is not None and "=" in line:
            key, _, value = line.partition("=")
            current.setdefault(key.strip(), value.strip())
    return devices


def _device_words(device: Mapping[str, str]) -> str:
    name = device.get("deviceName", "an unnamed device")
    kind = GPU_TYPES.get(device.get("deviceType", ""), "")
    driver = device.get("driverInfo") or device.get("driverName") or ""
    details = ", ".join(part for part in (kind, f"driver {driver}" if driver else "") if part)
    return f"{name} ({details})" if details else name


def vulkan_evidence(devices: Sequence[Mapping[str, str]], via: str) -> tuple[bool, str]:
    """Usable when a device is a GPU (discrete, integrated or virtual); CPU devices are named, not counted."""
    gpus = [d for d in devices if d.get("deviceType") in GPU_TYPES]
    cpus = [d.get("deviceName", "an unnamed device") for d in devices if d.get("deviceType") == CPU_TYPE]
    others = [
        f"{d.get('deviceName', 'an unnamed device')} ({d.get('deviceType', 'no type')})"
        for d in devices
        if d.get("deviceType") not in GPU_TYPES and d.get("deviceType") != CPU_TYPE
    ]
    if gpus:
        words = " and ".join(_device_words(d) for d in gpus) + f" through {via}"
        skipped = [f"{name}, a CPU device" for name in cpus] + [f"{o}, not a GPU" for o in others]
        return True, words + (f"; not counted: {'; '.join(skipped)}" if skipped else "")
    if cpus and not others:
        return False, (f"only a CPU device: {cpus[0]}" if len(cpus) == 1 else f"only CPU devices: {', '.join(cpus)}")
    if cpus or others:
        return False, "no GPU device: " + ", ".join([f"{c} (CPU)" for c in cpus] + others)
    return False, f"{via} lists no Vulkan device"


def native_devices(report: Mapping[str, Any]) -> list[dict[str, str]]:
    """The child's Vulkan report (see ``_native.query_vulkan``) as vulkaninfo-style devices."""
    if report.get("error"):
        raise ToolFailed(str(report["error"]))
    return [dict(d) for d in report.get("devices", [])]


class VulkanProbe(HostProbe):
    """Usable when the loader's drivers expose a device that is not a CPU implementation."""

    Options = VulkanOptions

    def check(self) -> tuple[bool, str]:
        windows = self.platform == "win32"
        manifests: list[DriverManifest] = []
        if not windows:
            plan = search_plan(self.env, self.host_path)
            manifests, problems = find_manifests(plan)
            if not manifests:
                return False, self._no_manifest(plan, problems)
        try:
            devices = parse_vulkaninfo_summary(self.tool(["vulkaninfo", "--summary"]))
            via = "vulkaninfo"
        except ToolFailed as exc:
            if not exc.missing:
                return False, f"{exc}{self._drivers(manifests)}"
            try:
                devices, via = self._ask_loader()
            except ToolFailed as native_exc:
                return False, f"vulkaninfo is not installed and the loader cannot be asked: {native_exc}"
        if not devices and via == "vulkaninfo":  # an old vulkaninfo without --summary's layout, perhaps
            with contextlib.suppress(ToolFailed):
                devices, via = self._ask_loader()
        usable, evidence = vulkan_evidence(devices, via)
        return usable, evidence + (self._drivers(manifests) if not devices else "")

    def _ask_loader(self) -> tuple[list[dict[str, str]], str]:
        report = self.native("vulkan")
        return native_devices(report), str(report.get("library", "the Vulkan loader"))

    @staticmethod
    def _drivers(manifests: Sequence[DriverManifest]) -> str:
        if not manifests:
            return ""
        return " (drivers: " + ", ".join(f"{os.path.basename(m.path)} -> {m.library}" for m in manifests) + ")"

    @staticmethod
    def _no_manifest(plan: SearchPlan, problems: Sequence[str]) -> str:
        if plan.override:
            why = f"no Vulkan driver manifest in {plan.override}={':'.join(s for s, _ in plan.entries)}"
        else:
            why = f"no Vulkan driver manifest in {plan.words()} (VK_DRIVER_FILES unset)"
        return why + (f": {'; '.join(problems)}" if problems else "")
