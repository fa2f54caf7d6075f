"""``vulkan``: the loader's manifest search, vulkaninfo --summary parsing, CPU devices not counted."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from arbiter.plugin import PluginContext
from arbiter_probes._host import Completed
from arbiter_probes.vulkan import (
    DriverManifest,
    SearchPlan,
    VulkanProbe,
    find_manifests,
    parse_driver_manifest,
    parse_vulkaninfo_summary,
    search_plan,
    vulkan_evidence,
)
from arbiter_testing.needs import need_tool
from arbiter_testing.probes import FakeRunner, MakeProbe

VK = Path(__file__).parent / "fixtures" / "vulkaninfo"
RTX4070 = (VK / "summary-linux-intel-igpu-nvidia-rtx4070laptop-llvmpipe.txt").read_text()
POWERVR = (VK / "summary-linux-powervr-ge8300-igpu-llvmpipe.txt").read_text()
WINDOWS = (VK / "summary-windows-amd-igpu-nvidia-rtx3070.txt").read_text()
LAVAPIPE = (VK / "summary-debian12-lavapipe-only.txt").read_text()
RTX4070_ONLY = RTX4070[: RTX4070.index("GPU0:")] + RTX4070[RTX4070.index("GPU1:") : RTX4070.index("GPU2:")]
LLVMPIPE_ONLY = RTX4070[: RTX4070.index("GPU0:")] + RTX4070[RTX4070.index("GPU2:") :]

FIXTURES = Path(__file__).parent / "fixtures"


# --- parsing -------------------------------------------------------------------------------------


def test_summary_with_an_igpu_a_discrete_gpu_and_llvmpipe() -> None:
    devices = parse_vulkaninfo_summary(RTX4070)
    assert [(d["deviceName"], d["deviceType"]) for d in devices] == [
        ("Intel(R) Graphics (RPL-S)", "PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU"),
        ("NVIDIA GeForce RTX 4070 Laptop GPU", "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU"),
        ("llvmpipe (LLVM 20.1.2, 256 bits)", "PHYSICAL_DEVICE_TYPE_CPU"),
    ]
    assert devices[1]["driverInfo"] == "595.84" and devices[1]["vendorID"] == "0x10de"


def test_summary_after_loader_warnings_and_with_windows_indent() -> None:
    assert [d["deviceName"] for d in parse_vulkaninfo_summary(POWERVR)] == [
        "PowerVR Rogue GE8300",
        "llvmpipe (LLVM 21.1.4, 128 bits)",
    ]
    assert [d["deviceType"] for d in parse_vulkaninfo_summary(WINDOWS)] == [
        "PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU",
        "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU",
    ]
    assert parse_vulkaninfo_summary("no devices section\n") == []


def test_evidence_names_gpus_and_leaves_out_the_cpu_device() -> None:
    assert vulkan_evidence(parse_vulkaninfo_summary(RTX4070), "vulkaninfo") == (
        True,
        "Intel(R) Graphics (RPL-S) (integrated GPU, driver Mesa 25.2.8-0ubuntu0.24.04.2) and "
        "NVIDIA GeForce RTX 4070 Laptop GPU (discrete GPU, driver 595.84) through vulkaninfo; "
        "not counted: llvmpipe (LLVM 20.1.2, 256 bits), a CPU device",
    )


def test_only_cpu_devices_are_not_usable() -> None:
    assert vulkan_evidence(parse_vulkaninfo_summary(LAVAPIPE), "vulkaninfo") == (
        False,
        "only a CPU device: llvmpipe (LLVM 15.0.6, 256 bits)",
    )
    two = [
        {"deviceName": "llvmpipe", "deviceType": "PHYSICAL_DEVICE_TYPE_CPU"},
        {"deviceName": "SwiftShader Device (Subzero)", "deviceType": "PHYSICAL_DEVICE_TYPE_CPU"},
    ]
    assert vulkan_evidence(two, "x") == (False, "only CPU devices: llvmpipe, SwiftShader Device (Subzero)")
    other = [{"deviceName": "Some NPU", "deviceType": "PHYSICAL_DEVICE_TYPE_OTHER"}]
    assert vulkan_evidence(other, "x") == (False, "no GPU device: Some NPU (PHYSICAL_DEVICE_TYPE_OTHER)")
    assert vulkan_evidence([], "vulkaninfo") == (False, "vulkaninfo lists no Vulkan device")


def test_driver_manifests() -> None:
    assert parse_driver_manifest((VK / "nvidia_icd.json").read_text()) == ("libGLX_nvidia.so.0", "1.4.303")
    assert parse_driver_manifest((VK / "lvp_icd.x86_64.json").read_text()) == ("/usr/lib64/libvulkan_lvp.so", "1.4.335")
    assert parse_driver_manifest((VK / "lvp_icd.x86_64-debian12.json").read_text()) == (
        "/usr/lib/x86_64-linux-gnu/libvulkan_lvp.so",
        "1.1.230",
    )
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_driver_manifest("{")
    with pytest.raises(ValueError, match=r"no ICD\.library_path"):
        parse_driver_manifest('{"file_format_version": "1.0.0", "layer": {}}')


# --- where the loader looks ------------------------------------------------------------------------


def test_the_default_search_follows_the_loader() -> None:
    plan = search_plan({"HOME": "/home/me"})
    assert plan.override is None
    assert [shown for shown, _ in plan.entries] == [
        "/home/me/.config/vulkan/icd.d",
        "/etc/xdg/vulkan/icd.d",
        "/usr/local/etc/vulkan/icd.d",
        "/etc/vulkan/icd.d",
        "/home/me/.local/share/vulkan/icd.d",
        "/usr/local/share/vulkan/icd.d",
        "/usr/share/vulkan/icd.d",
    ]


def test_xdg_variables_replace_their_fallbacks_and_built_in_paths_are_rooted() -> None:
    plan = search_plan(
        {"XDG_CONFIG_DIRS": "/opt/a:/opt/b", "XDG_DATA_DIRS": "/nix/share", "VK_ADD_DRIVER_FILES": "/x/extra.json"},
        rooted=lambda p: Path("/fake") / p.lstrip("/"),
    )
    assert plan.entries == (
        ("/x/extra.json", Path("/x/extra.json")),
        ("/opt/a/vulkan/icd.d", Path("/opt/a/vulkan/icd.d")),
        ("/opt/b/vulkan/icd.d", Path("/opt/b/vulkan/icd.d")),
        ("/usr/local/etc/vulkan/icd.d", Path("/fake/usr/local/etc/vulkan/icd.d")),
        ("/etc/vulkan/icd.d", Path("/fake/etc/vulkan/icd.d")),
        ("/nix/share/vulkan/icd.d", Path("/nix/share/vulkan/icd.d")),
    )


def test_vk_driver_files_overrides_and_vk_icd_filenames_is_the_older_name() -> None:
    env = {"VK_DRIVER_FILES": "/a.json:/d", "VK_ICD_FILENAMES": "/old.json", "VK_ADD_DRIVER_FILES": "/x.json"}
    assert search_plan(env) == SearchPlan((("/a.json", Path("/a.json")), ("/d", Path("/d"))), "VK_DRIVER_FILES")
    assert search_plan({"VK_ICD_FILENAMES": "/old.json"}).override == "VK_ICD_FILENAMES"
    assert search_plan({"VK_DRIVER_FILES": r"C:\a.json;C:\b.json"}, windows=True).entries[1][0] == r"C:\b.json"


def test_manifests_from_files_and_folders(tmp_path: Path) -> None:
    folder = tmp_path / "icd.d"
    folder.mkdir()
    shutil.copy(VK / "nvidia_icd.json", folder / "nvidia_icd.json")
    (folder / "broken.json").write_text("{")
    (folder / "README").write_text("not a manifest")
    single = tmp_path / "lvp.json"
    shutil.copy(VK / "lvp_icd.x86_64.json", single)
    plan = SearchPlan(((str(folder), folder), (str(single), single), ("/gone.json", tmp_path / "gone.json")), "X")
    manifests, problems = find_manifests(plan)
    assert manifests == [
        DriverManifest(f"{folder}/nvidia_icd.json", "libGLX_nvidia.so.0", "1.4.303"),
        DriverManifest(str(single), "/usr/lib64/libvulkan_lvp.so", "1.4.335"),
    ]
    assert problems == [f"{folder}/broken.json: not valid JSON", "/gone.json does not exist"]


# --- the probe on a faked host ---------------------------------------------------------------------


@pytest.fixture
def icd(tmp_path: Path) -> Path:
    path = tmp_path / "lvp_icd.x86_64.json"
    shutil.copy(VK / "lvp_icd.x86_64.json", path)
    return path


def test_llvmpipe_only_is_not_usable(icd: Path, make_probe: MakeProbe) -> None:
    run = FakeRunner({"vulkaninfo": LLVMPIPE_ONLY})
    probe = make_probe(VulkanProbe, run=run, env={"VK_DRIVER_FILES": str(icd)}, timeout_s=2)
    assert probe.probe() == (False, "only a CPU device: llvmpipe (LLVM 20.1.2, 256 bits)")
    argv, timeout_s, env = run.calls[0]
    assert argv == ["vulkaninfo", "--summary"] and timeout_s == 2 and env["VK_DRIVER_FILES"] == str(icd)


def test_an_nvidia_discrete_gpu_is_usable(tmp_path: Path, make_probe: MakeProbe) -> None:
    manifest = tmp_path / "nvidia_icd.json"
    shutil.copy(VK / "nvidia_icd.json", manifest)
    run = FakeRunner({"vulkaninfo": RTX4070_ONLY})
    assert make_probe(VulkanProbe, run=run, env={"VK_DRIVER_FILES": str(manifest)}).probe() == (
        True,
        "NVIDIA GeForce RTX 4070 Laptop GPU (discrete GPU, driver 595.84) through vulkaninfo",
    )


def test_manifests_under_the_root_are_found(tmp_path: Path, make_probe: MakeProbe) -> None:
    folder = tmp_path / "usr/share/vulkan/icd.d"
    folder.mkdir(parents=True)
    shutil.copy(VK / "nvidia_icd.json", folder)
    run = FakeRunner({"vulkaninfo": RTX4070})
    usable, why = make_probe(VulkanProbe, run=run, root=tmp_path).probe()
    assert usable and "NVIDIA GeForce RTX 4070 Laptop GPU" in why and "not counted: llvmpipe" in why


def test_no_manifest_anywhere(tmp_path: Path, make_probe: MakeProbe) -> None:
    run = FakeRunner({"vulkaninfo": RTX4070})
    assert make_probe(VulkanProbe, run=run, root=tmp_path, env={"HOME": "/home/me"}).probe() == (
        False,
        "no Vulkan driver manifest in /home/me/.config/vulkan/icd.d, /etc/xdg/vulkan/icd.d, "
        "/usr/local/etc/vulkan/icd.d, /etc/vulkan/icd.d, /home/me/.local/share/vulkan/icd.d, "
        "/usr/local/share/vulkan/icd.d, /usr/share/vulkan/icd.d (VK_DRIVER_FILES unset)",
    )
    assert run.calls == []  # nothing to enumerate: no command is run


def test_vk_driver_files_naming_nothing(tmp_path: Path, make_probe: MakeProbe) -> None:
    missing = tmp_path / "nope.json"
    assert make_probe(VulkanProbe, env={"VK_DRIVER_FILES": str(missing)}).probe() == (
        False,
        f"no Vulkan driver manifest in VK_DRIVER_FILES={missing}: {missing} does not exist",
    )


def test_vulkaninfo_that_fails_names_the_loader_error(icd: Path, make_probe: MakeProbe) -> None:
    stderr = (FIXTURES / "vulkaninfo" / "summary-debian12-driver-library-missing.stderr.txt").read_text()
    run = FakeRunner({"vulkaninfo": Completed(1, "", stderr)})
    usable, why = make_probe(VulkanProbe, run=run, env={"VK_DRIVER_FILES": str(icd)}).probe()
    assert not usable
    assert why.startswith(
        "vulkaninfo --summary failed (exit 1): /usr/lib/x86_64-linux-gnu/libvulkan_lvp.so: "
        "cannot open shared object file"
    )
    assert why.endswith("(drivers: lvp_icd.x86_64.json -> /usr/lib64/libvulkan_lvp.so)")


def test_vulkaninfo_that_hangs(icd: Path, make_probe: MakeProbe) -> None:
    run = FakeRunner({"vulkaninfo": subprocess.TimeoutExpired(["vulkaninfo"], 5)})
    usable, why = make_probe(VulkanProbe, run=run, env={"VK_DRIVER_FILES": str(icd)}).probe()
    assert not usable and why.startswith("vulkaninfo --summary did not finish within 5 s")


def test_without_vulkaninfo_the_loader_is_asked(icd: Path, make_probe: MakeProbe) -> None:
    report = {
        "library": "libvulkan.so.1",
        "devices": [
            {"deviceName": "llvmpipe (LLVM 15.0.6, 256 bits)", "deviceType": "PHYSICAL_DEVICE_TYPE_CPU"},
            {"deviceName": "AMD Radeon RX 7900 XTX (RADV NAVI31)", "deviceType": "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU"},
        ],
    }
    run = FakeRunner({"native:vulkan": report})
    assert make_probe(VulkanProbe, run=run, env={"VK_DRIVER_FILES": str(icd)}).probe() == (
        True,
        "AMD Radeon RX 7900 XTX (RADV NAVI31) (discrete GPU) through libvulkan.so.1; "
        "not counted: llvmpipe (LLVM 15.0.6, 256 bits), a CPU device",
    )
    assert run.programs == ["vulkaninfo", "native:vulkan"]


def test_without_vulkaninfo_or_loader(icd: Path, make_probe: MakeProbe) -> None:
    run = FakeRunner({"native:vulkan": {"library": "libvulkan.so.1", "error": "libvulkan.so.1 not found"}})
    assert make_probe(VulkanProbe, run=run, env={"VK_DRIVER_FILES": str(icd)}).probe() == (
        False,
        "vulkaninfo is not installed and the loader cannot be asked: libvulkan.so.1 not found",
    )


def test_windows_skips_the_manifest_search(make_probe: MakeProbe) -> None:
    run = FakeRunner({"vulkaninfo": WINDOWS})
    usable, why = make_probe(VulkanProbe, run=run, platform="win32").probe()
    assert usable and why.startswith("AMD Radeon(TM) Graphics (integrated GPU, driver 23.40.02")


# --- this host ---------------------------------------------------------------------------------------


def test_this_host_enumerates_a_cpu_device_and_does_not_count_it(context: PluginContext) -> None:
    """With Debian's mesa-vulkan-drivers and vulkan-tools (as .ci installs them), llvmpipe is found and
    not counted.  Skipped where vulkaninfo is missing, unless ARBITER_REQUIRE names vulkan."""
    need_tool("vulkaninfo", "vulkan")
    usable, why = VulkanProbe(VulkanProbe.Options(), context).probe()
    if usable:  # a host with a real GPU: the CPU device, if any, is named as not counted
        assert "llvmpipe" not in why or "a CPU device" in why
    else:
        assert why.startswith("only a CPU device: llvmpipe"), why


def test_this_host_answers_within_its_timeout(context: PluginContext) -> None:
    import time

    started = time.monotonic()
    usable, why = VulkanProbe(VulkanProbe.Options(timeout_s=5), context).probe()
    assert isinstance(usable, bool) and why
    assert time.monotonic() - started < 12  # one command and, at most, one child query


def test_vulkaninfo_output_without_devices_is_checked_with_the_loader(icd: Path, make_probe: MakeProbe) -> None:
    report = {
        "library": "libvulkan.so.1",
        "devices": [{"deviceName": "NVIDIA H200", "deviceType": "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU"}],
    }
    run = FakeRunner({"vulkaninfo": "VULKANINFO\n(an older layout)\n", "native:vulkan": report})
    assert make_probe(VulkanProbe, run=run, env={"VK_DRIVER_FILES": str(icd)}).probe() == (
        True,
        "NVIDIA H200 (discrete GPU) through libvulkan.so.1",
    )
    run = FakeRunner({"vulkaninfo": "VULKANINFO\n"})
    assert make_probe(VulkanProbe, run=run, env={"VK_DRIVER_FILES": str(icd)}).probe() == (
        False,
        "vulkaninfo lists no Vulkan device (drivers: lvp_icd.x86_64.json -> /usr/lib64/libvulkan_lvp.so)",
    )
