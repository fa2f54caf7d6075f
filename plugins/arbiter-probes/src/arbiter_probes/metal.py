"""``metal``: does macOS report a GPU with Metal support?

On macOS, ``system_profiler SPDisplaysDataType`` lists each GPU (``Chipset Model``) with a line
saying whether it supports Metal (``Metal Support: Metal 3`` on current systems; ``Metal: Supported,
feature set ...`` or ``Metal Family: Supported, ...`` on older ones).  Elsewhere Metal does not exist.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Literal

from arbiter_probes._host import HostProbe, ProbeOptions, ToolFailed

SYSTEM_PROFILER = "/usr/sbin/system_profiler"
NOT_MACOS = "not this platform: Metal exists only on macOS"

_FIELD = re.compile(r"^\s*([^:]+?):\s*(.*?)\s*$")
_UNSUPPORTED = re.compile(r"\b(not supported|unsupported|no)\b", re.IGNORECASE)


class MetalOptions(ProbeOptions):
    kind: Literal["metal"] = "metal"


def parse_displays(text: str) -> list[dict[str, str]]:
    """GPUs of ``system_profiler SPDisplaysDataType``: ``{"name", "metal"}`` (``metal`` empty when unsaid)."""
    gpus: list[dict[str, str]] = []
    for line in text.splitlines():
        match = _FIELD.match(line)
        if not match:
            continue
        key, value = match.group(1), match.group(2)
        if key == "Chipset Model":
            gpus.append({"name": value, "metal": ""})
        elif gpus and key.startswith("Metal") and value and not gpus[-1]["metal"]:
            gpus[-1]["metal"] = value if key in ("Metal", "Metal Support") else f"{key}: {value}"
    return gpus


def metal_supported(value: str) -> bool:
    return bool(value) and not _UNSUPPORTED.search(value)


def metal_evidence(gpus: Sequence[Mapping[str, str]]) -> tuple[bool, str]:
    good = [g for g in gpus if metal_supported(g.get("metal", ""))]
    if good:
        names = " and ".join(f"{g['name']} ({g['metal']})" for g in good)
        return True, f"{names} through system_profiler"
    if not gpus:
        return False, "system_profiler lists no GPU"
    listed = ", ".join(f"{g['name']} ({g.get('metal') or 'no Metal line'})" for g in gpus)
    return False, f"no GPU with Metal support: {listed}"


class MetalProbe(HostProbe):
    """Usable on macOS when a GPU reports Metal support."""

    Options = MetalOptions

    def check(self) -> tuple[bool, str]:
        if self.platform != "darwin":
            return False, NOT_MACOS
        try:
            text = self.tool([SYSTEM_PROFILER, "SPDisplaysDataType"])
        except ToolFailed as exc:
            return False, str(exc)
        return metal_evidence(parse_displays(text))
