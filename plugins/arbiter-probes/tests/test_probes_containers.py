"""``containers``: CDI specs, the GPU devices they expose, and the APIs they give a container."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from arbiter.plugin import PluginContext
from arbiter_probes.containers import CdiDevice, ContainersProbe, is_gpu_kind, parse_cdi_spec
from arbiter_testing.probes import MakeProbe

CDI = Path(__file__).parent / "fixtures" / "cdi"
JETSON = (CDI / "jetson-orin-nano-nvidia-ctk-0.5.0-trimmed.yaml").read_text()
X86_HEAD = (CDI / "nvidia-ctk-0.5.0-x86-global-edits-head-trimmed.yaml").read_text()

#: the x86 spec's recorded head (global edits) with the per-GPU part ``nvidia-ctk cdi generate``
#: writes after it, added here: devices ``0`` and ``all`` (as ``nvidia-ctk cdi list`` names them)
#: and driver mounts for Vulkan and OpenCL
X86_WHOLE = (
    X86_HEAD
    + """\
  - containerPath: /etc/vulkan/icd.d/nvidia_icd.json
    hostPath: /etc/vulkan/icd.d/nvidia_icd.json
    options: [ro, nosuid, nodev, bind]
  - containerPath: /usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.570.158.01
    hostPath: /usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.570.158.01
    options: [ro, nosuid, nodev, bind]
devices:
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    - path: /dev/dri/card1
    - path: /dev/dri/renderD128
  name: "0"
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
  name: all
kind: nvidia.com/gpu
"""
)

NETWORK = json.dumps(
    {
        "cdiVersion": "0.6.0",
        "kind": "vendor.com/net",
        "devices": [{"name": "eth1", "containerEdits": {"deviceNodes": [{"path": "/dev/net/tun"}]}}],
    }
)


def test_the_jetson_spec_exposes_its_gpu_and_gives_cuda() -> None:
    spec = parse_cdi_spec(JETSON, "/etc/cdi/jetson.yaml")
    assert spec.kind == "nvidia.com/orin-gpu"
    assert spec.devices == (CdiDevice("nvidia.com/orin-gpu", "all", True),)
    assert spec.apis == frozenset({"cuda"})  # it mounts tegra/libcuda.so.1.1


def test_a_spec_without_a_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="not a CDI spec"):
        parse_cdi_spec(X86_HEAD, "/etc/cdi/nvidia.yaml")
    with pytest.raises(ValueError, match="not valid YAML"):
        parse_cdi_spec("kind: [unclosed", "/etc/cdi/bad.yaml")
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_cdi_spec("{", "/etc/cdi/bad.json")


def test_a_whole_x86_spec_gives_cuda_vulkan_and_opencl() -> None:
    spec = parse_cdi_spec(X86_WHOLE, "/etc/cdi/nvidia.yaml")
    assert [d.qualified for d in spec.gpus] == ["nvidia.com/gpu=0", "nvidia.com/gpu=all"]
    assert spec.apis == frozenset({"cuda", "vulkan", "opencl"})


def test_gpu_devices_by_kind_or_by_device_node() -> None:
    assert is_gpu_kind("nvidia.com/gpu") and is_gpu_kind("amd.com/gpu") and is_gpu_kind("nvidia.com/orin-gpu")
    assert not is_gpu_kind("vendor.com/net") and not is_gpu_kind("gpu.example.com/net")
    spec = parse_cdi_spec(
        json.dumps(
            {
                "cdiVersion": "0.6.0",
                "kind": "example.com/accel",
                "devices": [
                    {
                        "name": "card0",
                        "containerEdits": {"deviceNodes": [{"path": "/dev/kfd"}, {"path": "/dev/dri/renderD128"}]},
                    },
                    {"name": "other", "containerEdits": {"deviceNodes": [{"path": "/dev/null"}]}},
                ],
            }
        ),
        "/var/run/cdi/amd.json",
    )
    assert [(d.name, d.gpu) for d in spec.devices] == [("card0", True), ("other", False)]
    assert spec.apis == frozenset({"rocm"})
    assert parse_cdi_spec(NETWORK, "/etc/cdi/net.json").apis == frozenset()


def cdi_host(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_probe_reports_gpu_devices_and_apis(tmp_path: Path, make_probe: MakeProbe) -> None:
    root = cdi_host(
        tmp_path,
        {"/etc/cdi/nvidia.yaml": X86_WHOLE, "/var/run/cdi/net.json": NETWORK, "/etc/cdi/notes.txt": "not a spec"},
    )
    probe = make_probe(ContainersProbe, root=root)
    assert probe.probe() == (
        True,
        "nvidia.com/gpu=0, nvidia.com/gpu=all from /etc/cdi/nvidia.yaml, giving cuda, opencl, vulkan",
    )
    assert probe.apis() == ["cuda", "opencl", "vulkan"]


def test_two_gpu_specs(tmp_path: Path, make_probe: MakeProbe) -> None:
    root = cdi_host(tmp_path, {"/etc/cdi/jetson.yaml": JETSON, "/var/run/cdi/nvidia.yaml": X86_WHOLE})
    usable, why = make_probe(ContainersProbe, root=root).probe()
    assert usable and why == (
        "nvidia.com/orin-gpu=all from /etc/cdi/jetson.yaml, giving cuda; "
        "nvidia.com/gpu=0, nvidia.com/gpu=all from /var/run/cdi/nvidia.yaml, giving cuda, opencl, vulkan"
    )


def test_no_spec_at_all(tmp_path: Path, make_probe: MakeProbe) -> None:
    probe = make_probe(ContainersProbe, root=tmp_path)
    assert probe.probe() == (False, "no CDI spec in /etc/cdi, /var/run/cdi")
    assert probe.apis() == []


def test_specs_without_gpus_and_broken_specs(tmp_path: Path, make_probe: MakeProbe) -> None:
    root = cdi_host(tmp_path, {"/etc/cdi/net.json": NETWORK, "/etc/cdi/head.yaml": X86_HEAD})
    assert make_probe(ContainersProbe, root=root).probe() == (
        False,
        "the CDI specs expose no GPU device: vendor.com/net=eth1 from /etc/cdi/net.json "
        "(/etc/cdi/head.yaml: not a CDI spec (no vendor.com/class kind))",
    )
    only_broken = cdi_host(tmp_path / "b", {"/etc/cdi/head.yaml": X86_HEAD})
    assert make_probe(ContainersProbe, root=only_broken).probe() == (
        False,
        "no CDI spec in /etc/cdi, /var/run/cdi (/etc/cdi/head.yaml: not a CDI spec (no vendor.com/class kind))",
    )


def test_spec_folders_are_an_option(tmp_path: Path, make_probe: MakeProbe) -> None:
    shutil.copy(CDI / "jetson-orin-nano-nvidia-ctk-0.5.0-trimmed.yaml", tmp_path / "orin.yaml")
    probe = make_probe(ContainersProbe, root="/", spec_dirs=[str(tmp_path)])
    assert probe.probe() == (True, f"nvidia.com/orin-gpu=all from {tmp_path}/orin.yaml, giving cuda")


def test_this_host(context: PluginContext) -> None:
    usable, why = ContainersProbe(ContainersProbe.Options(), context).probe()
    assert isinstance(usable, bool) and why
