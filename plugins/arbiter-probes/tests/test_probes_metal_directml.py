"""``metal`` (system_profiler on macOS) and ``directml`` (Direct3D 12 adapters on Windows).

The system_profiler texts below are written in the layout of public ``system_profiler
SPDisplaysDataType`` captures (Apple M2 Pro with ``Metal Support: Metal 3``; an Intel/AMD MacBook
Pro with ``Metal: Supported, feature set macOS GPUFamily2 v1``); none is a whole recorded capture.
"""

from __future__ import annotations

import subprocess

from arbiter_probes.directml import NOT_WINDOWS, DirectmlProbe, directml_evidence
from arbiter_probes.metal import NOT_MACOS, SYSTEM_PROFILER, MetalProbe, metal_evidence, parse_displays
from arbiter_testing.probes import FakeRunner, MakeProbe

APPLE_SILICON = """\
Graphics/Displays:

    Apple M2 Pro:

      Chipset Model: Apple M2 Pro
      Type: GPU
      Bus: Built-In
      Total Number of Cores: 19
      Vendor: Apple (0x106b)
      Metal Support: Metal 3
      Displays:
        Color LCD:
          Display Type: Built-in Liquid Retina XDR Display
          Resolution: 3024 x 1964 Retina
          Main Display: Yes
"""

INTEL_AND_AMD = """\
Graphics/Displays:

    Intel HD Graphics 530:

      Chipset Model: Intel HD Graphics 530
      Type: GPU
      Bus: Built-In
      VRAM (Dynamic, Max): 1536 MB
      Automatic Graphics Switching: Supported
      Metal: Supported, feature set macOS GPUFamily2 v1

    Radeon Pro 450:

      Chipset Model: AMD Radeon Pro 450
      Type: GPU
      Bus: PCIe
      Vendor: AMD (0x1002)
      Metal: Supported, feature set macOS GPUFamily2 v1
"""

NO_METAL = """\
Graphics/Displays:

    NVIDIA GeForce 9400M:

      Chipset Model: NVIDIA GeForce 9400M
      Type: GPU
      Metal: Not Supported
"""


def test_displays_are_parsed_with_their_metal_line() -> None:
    assert parse_displays(APPLE_SILICON) == [{"name": "Apple M2 Pro", "metal": "Metal 3"}]
    assert parse_displays(INTEL_AND_AMD) == [
        {"name": "Intel HD Graphics 530", "metal": "Supported, feature set macOS GPUFamily2 v1"},
        {"name": "AMD Radeon Pro 450", "metal": "Supported, feature set macOS GPUFamily2 v1"},
    ]
    assert parse_displays("Metal Family: Supported\n") == []  # a Metal line before any GPU is ignored


def test_metal_evidence() -> None:
    assert metal_evidence(parse_displays(APPLE_SILICON)) == (True, "Apple M2 Pro (Metal 3) through system_profiler")
    usable, why = metal_evidence(parse_displays(INTEL_AND_AMD))
    assert usable and why.startswith("Intel HD Graphics 530 (Supported, feature set macOS GPUFamily2 v1) and AMD")
    assert metal_evidence(parse_displays(NO_METAL)) == (
        False,
        "no GPU with Metal support: NVIDIA GeForce 9400M (Not Supported)",
    )
    assert metal_evidence([]) == (False, "system_profiler lists no GPU")


def test_the_metal_probe_runs_system_profiler_on_macos(make_probe: MakeProbe) -> None:
    run = FakeRunner({"system_profiler": APPLE_SILICON})
    assert make_probe(MetalProbe, run=run, platform="darwin", timeout_s=7).probe() == (
        True,
        "Apple M2 Pro (Metal 3) through system_profiler",
    )
    assert run.calls[0][:2] == ([SYSTEM_PROFILER, "SPDisplaysDataType"], 7)


def test_system_profiler_that_hangs(make_probe: MakeProbe) -> None:
    run = FakeRunner({"system_profiler": subprocess.TimeoutExpired(["system_profiler"], 5)})
    assert make_probe(MetalProbe, run=run, platform="darwin").probe() == (
        False,
        "system_profiler SPDisplaysDataType did not finish within 5 s",
    )


def test_metal_elsewhere_is_not_this_platform(make_probe: MakeProbe) -> None:
    run = FakeRunner({"system_profiler": APPLE_SILICON})
    for platform in ("linux", "win32"):
        assert make_probe(MetalProbe, run=run, platform=platform).probe() == (False, NOT_MACOS)
    assert run.calls == []
    assert NOT_MACOS == "not this platform: Metal exists only on macOS"


# --- directml ----------------------------------------------------------------------------------------

RTX3070 = {
    "name": "NVIDIA GeForce RTX 3070",
    "vendor_id": "0x10de",
    "software": False,
    "d3d12": True,
    "dedicated_mib": 8031,
}
WARP = {
    "name": "Microsoft Basic Render Driver",
    "vendor_id": "0x1414",
    "software": True,
    "d3d12": True,
    "dedicated_mib": 0,
}


def test_a_hardware_adapter_is_usable() -> None:
    report = {"directml_dll": r"C:\Windows\System32\DirectML.dll", "adapters": [RTX3070, WARP]}
    assert directml_evidence(report) == (
        True,
        r"NVIDIA GeForce RTX 3070 (8031 MiB) through Direct3D 12; DirectML.dll in C:\Windows\System32",
    )


def test_only_the_software_adapter_is_not_usable() -> None:
    assert directml_evidence({"directml_dll": None, "adapters": [WARP]}) == (
        False,
        "no hardware Direct3D 12 adapter: Microsoft Basic Render Driver (software)",
    )
    old = dict(RTX3070, name="NVIDIA GeForce GTX 580", d3d12=False)
    assert directml_evidence({"adapters": [old]}) == (
        False,
        "no hardware Direct3D 12 adapter: NVIDIA GeForce GTX 580 (no Direct3D 12 feature level 11_0)",
    )
    assert directml_evidence({"adapters": []}) == (False, "DXGI lists no adapter")
    assert directml_evidence({"error": "Direct3D 12 is not available: [WinError 126]"}) == (
        False,
        "Direct3D 12 is not available: [WinError 126]",
    )


def test_the_directml_probe_asks_a_child_on_windows(make_probe: MakeProbe) -> None:
    run = FakeRunner({"native:directml": {"directml_dll": None, "adapters": [RTX3070]}})
    assert make_probe(DirectmlProbe, run=run, platform="win32").probe() == (
        True,
        "NVIDIA GeForce RTX 3070 (8031 MiB) through Direct3D 12; no DirectML.dll in System32",
    )


def test_directml_elsewhere_is_not_this_platform(make_probe: MakeProbe) -> None:
    run = FakeRunner()
    assert make_probe(DirectmlProbe, run=run, platform="linux").probe() == (False, NOT_WINDOWS)
    assert run.calls == [] and NOT_WINDOWS == "not this platform: DirectML exists only on Windows"
