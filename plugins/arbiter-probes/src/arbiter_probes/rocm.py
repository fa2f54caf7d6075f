"""``rocm``: is there an AMD GPU the ROCm runtime can use?

ROCm reaches a GPU through ``/dev/kfd``, the amdgpu kernel driver's compute interface, and finds
GPUs in the KFD topology (``/sys/class/kfd/kfd/topology/nodes/*/properties``): a node with
``simd_count`` above 0 is a GPU, a CPU node has 0.  Where the topology shows no GPU node,
``rocminfo``'s agents are asked instead.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from arbiter_probes._host import HostProbe, ProbeOptions, ToolFailed, plural

KFD = "/dev/kfd"
TOPOLOGY_NODES = "/sys/class/kfd/kfd/topology/nodes"
ROCMINFO_FALLBACK = "/opt/rocm/bin/rocminfo"
NOT_LINUX = "not this platform: ROCm's /dev/kfd exists only on Linux"
NO_KFD = "no /dev/kfd: the amdgpu kernel driver offers no compute interface here"
NO_ACCESS = "/dev/kfd is there but this account cannot open it read-write (add it to the render and video groups)"


class RocmOptions(ProbeOptions):
    kind: Literal["rocm"] = "rocm"


def parse_kfd_properties(text: str) -> dict[str, int]:
    """A topology node's ``properties`` file (``name value`` lines) as numbers."""
    props: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                props[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return props


def gfx_name(target_version: int) -> str | None:
    """``gfx_target_version`` as the ISA name: 90010 is ``gfx90a``, 110000 is ``gfx1100``."""
    if target_version <= 0:
        return None
    major, minor, stepping = target_version // 10000, target_version // 100 % 100, target_version % 100
    return f"gfx{major}{minor}{stepping:x}"


@dataclass(frozen=True)
class KfdGpu:
    node: int
    simds: int
    gfx: str | None
    device_id: int

    def words(self) -> str:
        name = self.gfx or (f"device 0x{self.device_id:04x}" if self.device_id else "a GPU")
        return f"{name} (KFD node {self.node}, {self.simds} SIMDs)"


def kfd_gpus(nodes: Mapping[int, Mapping[str, int]]) -> list[KfdGpu]:
    """The GPU nodes (``simd_count`` above 0) of a topology given as ``{node: properties}``."""
    gpus = []
    for node, props in sorted(nodes.items()):
        simds = props.get("simd_count", 0)
        if simds > 0:
            gpus.append(KfdGpu(node, simds, gfx_name(props.get("gfx_target_version", 0)), props.get("device_id", 0)))
    return gpus


_AGENT = re.compile(r"^\s*Agent\s+\d+\s*$", re.MULTILINE)
_FIELD = re.compile(r"^\s*([A-Za-z][A-Za-z .()]*?):\s*(.*?)\s*$")


def parse_rocminfo(text: str) -> list[dict[str, str]]:
    """``rocminfo``'s agents, each as its first value per field (``Name``, ``Marketing Name``, ...)."""
    agents = []
    for block in _AGENT.split(text)[1:]:  # what precedes the first agent is the header
        fields: dict[str, str] = {}
        for line in block.splitlines():
            match = _FIELD.match(line)
            if match and match.group(1) not in fields:
                fields[match.group(1)] = match.group(2)
        agents.append(fields)
    return agents


def rocminfo_gpus(agents: Sequence[Mapping[str, str]]) -> list[str]:
    """The GPU agents, named by marketing name and ISA where rocminfo gives them."""
    names = []
    for agent in agents:
        if agent.get("Device Type", "").upper() != "GPU":
            continue
        marketing = agent.get("Marketing Name", "")
        isa = agent.get("Name", "")
        if marketing and marketing.upper() != "N/A" and isa and isa != marketing:
            names.append(f"{marketing} ({isa})")
        else:
            names.append(marketing or isa or "a GPU")
    return names


def _listing(names: Sequence[str], word: str) -> str:
    return names[0] if len(names) == 1 else f"{plural(len(names), word)}: " + ", ".join(names)


class RocmProbe(HostProbe):
    """Usable when ``/dev/kfd`` opens and the KFD topology (or rocminfo) shows a GPU."""

    Options = RocmOptions

    def check(self) -> tuple[bool, str]:
        if not self.platform.startswith("linux"):
            return False, NOT_LINUX
        kfd = self.host_path(KFD)
        if not os.path.exists(kfd):
            return False, NO_KFD
        if not os.access(kfd, os.R_OK | os.W_OK):
            return False, NO_ACCESS
        nodes, topology_why = self._topology()
        gpus = kfd_gpus(nodes)
        if gpus:
            return True, f"AMD {_listing([g.words() for g in gpus], 'GPU')} through /dev/kfd"
        try:
            agents = parse_rocminfo(self._rocminfo())
        except ToolFailed as exc:
            return False, f"{topology_why}, and {exc}"
        names = rocminfo_gpus(agents)
        if names:
            return True, f"{_listing(names, 'GPU')} through /dev/kfd (rocminfo; {topology_why})"
        return False, f"{topology_why}, and rocminfo lists no GPU agent ({plural(len(agents), 'agent')})"

    def _topology(self) -> tuple[dict[int, dict[str, int]], str]:
        folder = self.host_path(TOPOLOGY_NODES)
        nodes: dict[int, dict[str, int]] = {}
        try:
            entries = os.listdir(folder)
        except OSError:
            return nodes, f"no KFD topology at {TOPOLOGY_NODES}"
        for entry in entries:
            if not entry.isdigit():
                continue
            try:
                with open(folder / entry / "properties", encoding="utf-8", errors="replace") as fh:
                    nodes[int(entry)] = parse_kfd_properties(fh.read())
            except OSError:
                continue
        if not nodes:
            return nodes, f"no readable node in the KFD topology at {TOPOLOGY_NODES}"
        return nodes, f"the KFD topology has no GPU node ({plural(len(nodes), 'node')}, all with simd_count 0)"

    def _rocminfo(self) -> str:
        try:
            return self.tool(["rocminfo"])
        except ToolFailed as exc:
            fallback = self.host_path(ROCMINFO_FALLBACK)
            if not exc.missing or not os.path.exists(fallback):
                raise
            return self.tool([str(fallback)])
