"""``opencl``: ICD discovery, clinfo parsing, only GPU devices counted."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from arbiter.plugin import PluginContext
from arbiter_probes._host import Completed
from arbiter_probes.opencl import Icd, OpenclProbe, find_icds, opencl_evidence, parse_clinfo, parse_icd_file
from arbiter_testing.needs import need_tool
from arbiter_testing.probes import FakeRunner, MakeProbe

CL = Path(__file__).parent / "fixtures" / "clinfo"
CLOVER = (CL / "clinfo-full-clover-amd-rx5500xt-and-empty-rusticl.txt").read_text()
TERMUX = (CL / "clinfo-pocl-cpu-aarch64-termux-partial.txt").read_text()
POCL = (CL / "clinfo-debian12-pocl-cpu-only.txt").read_text()
NO_PLATFORM = (CL / "clinfo-debian12-no-platform.txt").read_text()
RX5500 = "AMD Radeon RX 5500 XT (navi14, LLVM 15.0.7, DRM 3.52, 6.3.9-arch1-1)"


def test_full_clinfo_with_a_gpu_platform_and_an_empty_one() -> None:
    assert parse_clinfo(CLOVER) == [
        {"name": "Clover", "devices": [{"name": RX5500, "type": "GPU"}]},
        {"name": "rusticl", "devices": []},
    ]


def test_full_clinfo_with_pocl_cpu_devices() -> None:
    assert parse_clinfo(POCL) == [
        {"name": "Portable Computing Language", "devices": [{"name": "pthread-haswell-AMD EPYC", "type": "CPU"}]}
    ]
    assert parse_clinfo(TERMUX) == [
        {
            "name": "Portable Computing Language",
            "devices": [{"name": "pthread-AArch64 Processor rev 4 (aarch64)", "type": "CPU"}],
        }
    ]
    assert parse_clinfo(NO_PLATFORM) == []


def test_only_gpu_devices_count() -> None:
    assert opencl_evidence(parse_clinfo(CLOVER), "clinfo") == (True, f"{RX5500} on Clover through clinfo")
    assert opencl_evidence(parse_clinfo(POCL), "clinfo") == (
        False,
        "only a CPU device: pthread-haswell-AMD EPYC on Portable Computing Language",
    )
    mixed = parse_clinfo(CLOVER) + parse_clinfo(POCL)
    assert opencl_evidence(mixed, "clinfo") == (
        True,
        f"{RX5500} on Clover through clinfo; "
        "not counted: pthread-haswell-AMD EPYC on Portable Computing Language, a CPU device",
    )
    accelerator = [{"name": "FPGA", "devices": [{"name": "fpga0", "type": "Accelerator"}]}]
    assert opencl_evidence(accelerator, "clinfo") == (False, "no GPU device: fpga0 on FPGA (Accelerator)")
    assert opencl_evidence([], "clinfo") == (False, "clinfo finds no OpenCL platform")
    assert opencl_evidence([{"name": "rusticl", "devices": []}], "clinfo") == (
        False,
        "clinfo lists no OpenCL device (rusticl with 0 devices)",
    )


def test_icd_files_name_their_library() -> None:
    assert parse_icd_file((CL / "pocl-debian12.icd").read_text()) == "libpocl.so.2.10.0"
    assert parse_icd_file("\n  libnvidia-opencl.so.1  \n") == "libnvidia-opencl.so.1"
    assert parse_icd_file("") is None


@pytest.fixture
def vendors(tmp_path: Path) -> Path:
    folder = tmp_path / "vendors"
    folder.mkdir()
    shutil.copy(CL / "pocl-debian12.icd", folder / "pocl.icd")
    (folder / "nvidia.icd").write_text("libnvidia-opencl.so.1\n")
    (folder / "notes.txt").write_text("ignored")
    return folder


def test_icds_from_the_default_folder_under_the_root(tmp_path: Path, vendors: Path) -> None:
    root = tmp_path / "root"
    (root / "etc/OpenCL").mkdir(parents=True)
    shutil.copytree(vendors, root / "etc/OpenCL/vendors")
    icds, where = find_icds({}, rooted=lambda p: root / p.lstrip("/"))
    assert icds == [
        Icd("/etc/OpenCL/vendors/nvidia.icd", "libnvidia-opencl.so.1"),
        Icd("/etc/OpenCL/vendors/pocl.icd", "libpocl.so.2.10.0"),
    ]
    assert where == "/etc/OpenCL/vendors (OCL_ICD_VENDORS unset)"


def test_ocl_icd_vendors_as_a_folder_a_file_or_a_library(vendors: Path) -> None:
    icds, where = find_icds({"OCL_ICD_VENDORS": str(vendors), "OPENCL_VENDOR_PATH": "/ignored"})
    assert [i.library for i in icds] == ["libnvidia-opencl.so.1", "libpocl.so.2.10.0"]
    assert where == f"OCL_ICD_VENDORS={vendors}"
    icds, _ = find_icds({"OCL_ICD_VENDORS": str(vendors / "pocl.icd")})
    assert icds == [Icd(str(vendors / "pocl.icd"), "libpocl.so.2.10.0")]
    icds, _ = find_icds({"OCL_ICD_VENDORS": "libintelocl.so"})
    assert icds == [Icd("OCL_ICD_VENDORS", "libintelocl.so")]


def test_opencl_vendor_path_and_ocl_icd_filenames(vendors: Path) -> None:
    icds, where = find_icds({"OPENCL_VENDOR_PATH": str(vendors), "OCL_ICD_FILENAMES": "/opt/a.so:/opt/b.so"})
    assert [i.library for i in icds] == ["libnvidia-opencl.so.1", "libpocl.so.2.10.0", "/opt/a.so", "/opt/b.so"]
    assert where == f"{vendors} (OPENCL_VENDOR_PATH)"


def test_no_icd_is_not_usable_without_running_anything(tmp_path: Path, make_probe: MakeProbe) -> None:
    run = FakeRunner({"clinfo": CLOVER})
    assert make_probe(OpenclProbe, run=run, root=tmp_path).probe() == (
        False,
        "no OpenCL ICD in /etc/OpenCL/vendors (OCL_ICD_VENDORS unset)",
    )
    assert run.calls == []


def test_pocl_only_is_not_usable(vendors: Path, make_probe: MakeProbe) -> None:
    run = FakeRunner({"clinfo": POCL})
    probe = make_probe(OpenclProbe, run=run, env={"OCL_ICD_VENDORS": str(vendors)}, timeout_s=4)
    assert probe.probe() == (False, "only a CPU device: pthread-haswell-AMD EPYC on Portable Computing Language")
    argv, timeout_s, env = run.calls[0]
    assert argv == ["clinfo"] and timeout_s == 4 and env == {"OCL_ICD_VENDORS": str(vendors)}


def test_a_gpu_device_is_usable(vendors: Path, make_probe: MakeProbe) -> None:
    run = FakeRunner({"clinfo": CLOVER})
    assert make_probe(OpenclProbe, run=run, env={"OCL_ICD_VENDORS": str(vendors)}).probe() == (
        True,
        f"{RX5500} on Clover through clinfo",
    )


def test_no_platform_lists_the_icds(vendors: Path, make_probe: MakeProbe) -> None:
    run = FakeRunner({"clinfo": NO_PLATFORM})
    assert make_probe(OpenclProbe, run=run, env={"OCL_ICD_VENDORS": str(vendors)}).probe() == (
        False,
        "clinfo finds no OpenCL platform (ICDs: nvidia.icd -> libnvidia-opencl.so.1, pocl.icd -> libpocl.so.2.10.0)",
    )


def test_without_clinfo_the_icd_loader_is_asked(vendors: Path, make_probe: MakeProbe) -> None:
    report = {
        "library": "libOpenCL.so.1",
        "platforms": [
            {"name": "NVIDIA CUDA", "devices": [{"name": "NVIDIA GeForce RTX 3090", "type": "GPU"}]},
            {"name": "Portable Computing Language", "devices": [{"name": "cpu", "type": "CPU"}]},
        ],
    }
    run = FakeRunner({"native:opencl": report})
    assert make_probe(OpenclProbe, run=run, env={"OCL_ICD_VENDORS": str(vendors)}).probe() == (
        True,
        "NVIDIA GeForce RTX 3090 on NVIDIA CUDA through libOpenCL.so.1; "
        "not counted: cpu on Portable Computing Language, a CPU device",
    )
    assert run.programs == ["clinfo", "native:opencl"]


def test_clinfo_failing_and_no_loader(vendors: Path, make_probe: MakeProbe) -> None:
    run = FakeRunner(
        {
            "clinfo": Completed(139, "", ""),
            "native:opencl": {"library": "libOpenCL.so.1", "error": "libOpenCL.so.1 not found"},
        }
    )
    usable, why = make_probe(OpenclProbe, run=run, env={"OCL_ICD_VENDORS": str(vendors)}).probe()
    assert not usable
    assert why.startswith(
        "clinfo failed (exit 139): no output, and the ICD loader cannot be asked: "
        "libOpenCL.so.1 not found (ICDs: nvidia.icd"
    )


def test_macos_and_windows_skip_the_icd_files(make_probe: MakeProbe) -> None:
    run = FakeRunner({"clinfo": CLOVER})
    assert make_probe(OpenclProbe, run=run, platform="darwin").probe()[0]
    assert make_probe(OpenclProbe, run=run, platform="win32").probe()[0]


# --- this host ---------------------------------------------------------------------------------------


def test_this_host_enumerates_pocl_and_does_not_count_it(context: PluginContext) -> None:
    """With Debian's pocl-opencl-icd and clinfo (as .ci installs them), PoCL's CPU device is found and
    not counted.  Skipped where clinfo is missing, unless ARBITER_REQUIRE names opencl."""
    need_tool("clinfo", "opencl")
    usable, why = OpenclProbe(OpenclProbe.Options(), context).probe()
    if usable:
        assert "Portable Computing Language" not in why or "a CPU device" in why
    else:
        assert why.startswith("only a CPU device: ") and "Portable Computing Language" in why, why
