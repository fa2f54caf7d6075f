"""``rocm``: KFD topology fixtures, a faked /dev/kfd, and rocminfo as the fallback."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from arbiter_probes._host import Completed
from arbiter_probes.rocm import (
    NO_ACCESS,
    NO_KFD,
    NOT_LINUX,
    KfdGpu,
    RocmProbe,
    gfx_name,
    kfd_gpus,
    parse_kfd_properties,
    parse_rocminfo,
    rocminfo_gpus,
)
from arbiter_testing.probes import FakeRunner, MakeProbe

KFD = Path(__file__).parent / "fixtures" / "kfd-topology"

#: constructed in rocminfo's layout (agents between ``*******`` lines, two-space fields); values from
#: public rocminfo captures of an EPYC host with a Radeon PRO W7600
ROCMINFO = """\
ROCk module is loaded
=====================
HSA Agents
==========
*******
Agent 1
*******
  Name:                    AMD EPYC 7313P 16-Core Processor
  Uuid:                    CPU-XX
  Marketing Name:          AMD EPYC 7313P 16-Core Processor
  Vendor Name:             CPU
  Node:                    0
  Device Type:             CPU
*******
Agent 2
*******
  Name:                    gfx1102
  Uuid:                    GPU-XX
  Marketing Name:          AMD Radeon PRO W7600
  Vendor Name:             AMD
  Node:                    1
  Device Type:             GPU
  Cache Info:
    L1:                      32(0x20) KB
  ISA Info:
    ISA 1
      Name:                    amdgcn-amd-amdhsa--gfx1102
*** Done ***
"""


def props(name: str) -> dict[str, int]:
    return parse_kfd_properties((KFD / name).read_text())


def test_properties_of_cpu_and_gpu_nodes() -> None:
    cpu = props("mi210-host-node0-cpu.properties")
    gpu = props("mi210-host-node2-gpu-gfx90a.properties")
    assert cpu["simd_count"] == 0 and cpu["cpu_cores_count"] == 64
    assert gpu["simd_count"] == 416 and gpu["gfx_target_version"] == 90010
    assert gpu["hive_id"] == 12609507387757274807  # 64-bit values stay exact


def test_gfx_names_from_target_versions() -> None:
    assert gfx_name(90010) == "gfx90a"
    assert gfx_name(90402) == "gfx942"
    assert gfx_name(110000) == "gfx1100"
    assert gfx_name(100300) == "gfx1030"
    assert gfx_name(0) is None


def test_only_nodes_with_simds_are_gpus() -> None:
    nodes = {
        0: props("mi210-host-node0-cpu.properties"),
        2: props("mi210-host-node2-gpu-gfx90a.properties"),
        3: props("mi300x-cpx-node2-gpu-partition-gfx942.properties"),
    }
    assert kfd_gpus(nodes) == [KfdGpu(2, 416, "gfx90a", 29711), KfdGpu(3, 152, "gfx942", 29857)]


def test_a_2018_node_without_gfx_target_version_is_named_by_device_id() -> None:
    gpus = kfd_gpus(
        {
            0: props("vega10-2018-node0-cpu.properties"),
            1: props("vega10-2018-node1-gpu-no-gfx_target_version.properties"),
        }
    )
    assert [g.words() for g in gpus] == ["device 0x6860 (KFD node 1, 256 SIMDs)"]


def test_rocminfo_agents_and_gpus() -> None:
    agents = parse_rocminfo(ROCMINFO)
    assert [a["Device Type"] for a in agents] == ["CPU", "GPU"]
    assert agents[1]["Name"] == "gfx1102"  # the first Name, not the ISA's
    assert rocminfo_gpus(agents) == ["AMD Radeon PRO W7600 (gfx1102)"]


def host(tmp_path: Path, nodes: dict[int, str], kfd: bool = True) -> Path:
    if kfd:
        (tmp_path / "dev").mkdir()
        (tmp_path / "dev" / "kfd").write_text("")
    topology = tmp_path / "sys/class/kfd/kfd/topology/nodes"
    for node, fixture in nodes.items():
        (topology / str(node)).mkdir(parents=True)
        shutil.copy(KFD / fixture, topology / str(node) / "properties")
    return tmp_path


def test_an_mi210_host_is_usable(tmp_path: Path, make_probe: MakeProbe) -> None:
    root = host(tmp_path, {0: "mi210-host-node0-cpu.properties", 2: "mi210-host-node2-gpu-gfx90a.properties"})
    run = FakeRunner()
    assert make_probe(RocmProbe, run=run, root=root).probe() == (
        True,
        "AMD gfx90a (KFD node 2, 416 SIMDs) through /dev/kfd",
    )
    assert run.calls == []  # the topology answered: rocminfo is not run


def test_two_gpus_are_listed(tmp_path: Path, make_probe: MakeProbe) -> None:
    root = host(
        tmp_path, {2: "mi210-host-node2-gpu-gfx90a.properties", 3: "mi300x-cpx-node2-gpu-partition-gfx942.properties"}
    )
    assert make_probe(RocmProbe, root=root).probe() == (
        True,
        "AMD 2 GPUs: gfx90a (KFD node 2, 416 SIMDs), gfx942 (KFD node 3, 152 SIMDs) through /dev/kfd",
    )


def test_no_kfd(tmp_path: Path, make_probe: MakeProbe) -> None:
    root = host(tmp_path, {2: "mi210-host-node2-gpu-gfx90a.properties"}, kfd=False)
    assert make_probe(RocmProbe, root=root).probe() == (False, NO_KFD)
    assert NO_KFD.startswith("no /dev/kfd")


def test_a_kfd_this_account_cannot_open(tmp_path: Path, make_probe: MakeProbe, monkeypatch: pytest.MonkeyPatch) -> None:
    root = host(tmp_path, {2: "mi210-host-node2-gpu-gfx90a.properties"})
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # the os module rocm asks
    assert make_probe(RocmProbe, root=root).probe() == (False, NO_ACCESS)


def test_cpu_nodes_only_and_no_rocminfo(tmp_path: Path, make_probe: MakeProbe) -> None:
    root = host(tmp_path, {0: "mi210-host-node0-cpu.properties"})
    assert make_probe(RocmProbe, root=root).probe() == (
        False,
        "the KFD topology has no GPU node (1 node, all with simd_count 0), "
        "and rocminfo is not installed (not found on PATH)",
    )


def test_rocminfo_answers_where_the_topology_is_missing(tmp_path: Path, make_probe: MakeProbe) -> None:
    root = host(tmp_path, {})
    run = FakeRunner({"rocminfo": ROCMINFO})
    assert make_probe(RocmProbe, root=root, run=run).probe() == (
        True,
        "AMD Radeon PRO W7600 (gfx1102) through /dev/kfd "
        "(rocminfo; no KFD topology at /sys/class/kfd/kfd/topology/nodes)",
    )


def test_rocminfo_under_opt_rocm_when_not_on_path(tmp_path: Path, make_probe: MakeProbe) -> None:
    root = host(tmp_path, {})
    (root / "opt/rocm/bin").mkdir(parents=True)
    (root / "opt/rocm/bin/rocminfo").write_text("")
    seen: list[str] = []

    def run(argv: Sequence[str], timeout_s: float, env: Mapping[str, str]) -> Completed:
        seen.append(argv[0])
        if argv[0] == "rocminfo":
            raise FileNotFoundError(2, "not found", "rocminfo")
        return Completed(0, ROCMINFO)

    usable, _ = make_probe(RocmProbe, root=root, run=run).probe()
    assert usable and seen == ["rocminfo", str(root / "opt/rocm/bin/rocminfo")]


def test_rocminfo_with_cpu_agents_only(tmp_path: Path, make_probe: MakeProbe) -> None:
    root = host(tmp_path, {})
    cpu_only = ROCMINFO[: ROCMINFO.index("*******\nAgent 2")]
    run = FakeRunner({"rocminfo": cpu_only})
    assert make_probe(RocmProbe, root=root, run=run).probe() == (
        False,
        "no KFD topology at /sys/class/kfd/kfd/topology/nodes, and rocminfo lists no GPU agent (1 agent)",
    )


def test_rocminfo_that_fails(tmp_path: Path, make_probe: MakeProbe) -> None:
    root = host(tmp_path, {})
    stderr = "hsa api call failure at: rocminfo.cc:1306\nError: HSA_STATUS_ERROR"
    run = FakeRunner({"rocminfo": Completed(1, "", stderr)})
    usable, why = make_probe(RocmProbe, root=root, run=run).probe()
    assert not usable
    assert why.endswith("and rocminfo failed (exit 1): Error: HSA_STATUS_ERROR")


def test_elsewhere_it_is_not_this_platform(make_probe: MakeProbe) -> None:
    assert make_probe(RocmProbe, platform="darwin").probe() == (False, NOT_LINUX)
    assert make_probe(RocmProbe, platform="win32").probe()[1].startswith("not this platform")


def test_this_host(make_probe: MakeProbe) -> None:
    probe = RocmProbe(RocmProbe.Options(), make_probe(RocmProbe).context)
    usable, why = probe.probe()
    if not os.path.exists("/dev/kfd"):
        assert (usable, why) == (False, NO_KFD)
