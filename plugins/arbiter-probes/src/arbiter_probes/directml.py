"""``directml``: is there a hardware Direct3D 12 adapter for DirectML to run on?

On Windows, DXGI's adapters are enumerated (in a child process) and each is asked whether it can
make a Direct3D 12 device at feature level 11_0, which DirectML needs.  A software adapter (the
Microsoft Basic Render Driver, WARP) is named and not counted.  Whether ``DirectML.dll`` is in
System32 is reported too; programs often bring their own copy, so it does not decide.
Elsewhere DirectML does not exist.
"""

from __future__ import annotations

import ntpath
from collections.abc import Mapping
from typing import Any, Literal

from arbiter_probes._host import HostProbe, ProbeOptions, ToolFailed

NOT_WINDOWS = "not this platform: DirectML exists only on Windows"


class DirectmlOptions(ProbeOptions):
    kind: Literal["directml"] = "directml"


def directml_evidence(report: Mapping[str, Any]) -> tuple[bool, str]:
    """Decide from the child's report (see ``_native.query_directml``)."""
    if report.get("error"):
        return False, str(report["error"])
    dll = report.get("directml_dll")
    dll_words = f"DirectML.dll in {ntpath.dirname(dll)}" if dll else "no DirectML.dll in System32"
    adapters = report.get("adapters", [])
    hardware = [a for a in adapters if a.get("d3d12") and not a.get("software")]
    if hardware:
        names = " and ".join(
            f"{a.get('name', 'an adapter')} ({a.get('dedicated_mib', 0)} MiB)"
            if a.get("dedicated_mib")
            else str(a.get("name", "an adapter"))
            for a in hardware
        )
        return True, f"{names} through Direct3D 12; {dll_words}"
    if not adapters:
        return False, "DXGI lists no adapter"
    listed = ", ".join(
        f"{a.get('name', 'an adapter')} ({'software' if a.get('software') else 'no Direct3D 12 feature level 11_0'})"
        for a in adapters
    )
    return False, f"no hardware Direct3D 12 adapter: {listed}"


class DirectmlProbe(HostProbe):
    """Usable on Windows when a hardware adapter can make a Direct3D 12 device."""

    Options = DirectmlOptions

    def check(self) -> tuple[bool, str]:
        if self.platform != "win32":
            return False, NOT_WINDOWS
        try:
            report = self.native("directml")
        except ToolFailed as exc:
            return False, f"the Direct3D 12 query failed: {exc}"
        return directml_evidence(report)
