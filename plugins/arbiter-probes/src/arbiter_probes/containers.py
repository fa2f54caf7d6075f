"""``containers``: which GPUs (and GPU APIs) can a container get through CDI?

Reads the Container Device Interface specs (``*.yaml``, ``*.json``) in ``/etc/cdi`` and
``/var/run/cdi`` and reports the devices they expose as ``kind=name`` (``nvidia.com/gpu=0``).  A
device counts as a GPU when its kind's class names one (``nvidia.com/gpu``, ``amd.com/gpu``) or
its device nodes are GPU nodes (``/dev/nvidia0``, ``/dev/dri/renderD128``, ``/dev/kfd``, ...).
Usable when any spec exposes a GPU device.

:meth:`ContainersProbe.apis` says which APIs such a container gets, from what the spec puts in
it: ``cuda`` when it mounts ``libcuda.so``, ``vulkan`` when it mounts a Vulkan driver manifest,
``opencl`` when it mounts an OpenCL ICD or NVIDIA's OpenCL driver, ``rocm`` with ``/dev/kfd``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml
from pydantic import Field

from arbiter_probes._host import HostProbe, ProbeOptions

SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
SPEC_SUFFIXES = (".yaml", ".json")

_GPU_NODE = re.compile(r"^/dev/(nvidia\d+|dri/(renderD|card)\d+|kfd|nvgpu/|nvhost-gpu|nvhost-ctrl-gpu|dxg)")
_API_MARKS = {
    "cuda": re.compile(r"libcuda\.so"),
    "vulkan": re.compile(r"/vulkan/icd\.d/[^/]+\.json$"),
    "opencl": re.compile(r"(/OpenCL/vendors/[^/]+\.icd$|libnvidia-opencl\.so|libamdocl)"),
    "rocm": re.compile(r"^/dev/kfd$"),
}


class ContainersOptions(ProbeOptions):
    kind: Literal["containers"] = "containers"
    #: the folders CDI specs are read from
    spec_dirs: tuple[str, ...] = Field(default=SPEC_DIRS, min_length=1)


@dataclass(frozen=True)
class CdiDevice:
    kind: str
    name: str
    gpu: bool

    @property
    def qualified(self) -> str:
        return f"{self.kind}={self.name}"


@dataclass(frozen=True)
class CdiSpec:
    path: str
    kind: str
    devices: tuple[CdiDevice, ...]
    apis: frozenset[str] = field(default_factory=frozenset)

    @property
    def gpus(self) -> tuple[CdiDevice, ...]:
        return tuple(d for d in self.devices if d.gpu)


def _edit_strings(edits: Any) -> Iterator[str]:
    """Every path and hook argument of a ``containerEdits`` block."""
    if not isinstance(edits, dict):
        return
    for node in edits.get("deviceNodes") or []:
        if isinstance(node, dict) and isinstance(node.get("path"), str):
            yield node["path"]
    for mount in edits.get("mounts") or []:
        if isinstance(mount, dict):
            yield from (str(mount[k]) for k in ("hostPath", "containerPath") if k in mount)
    for hook in edits.get("hooks") or []:
        if isinstance(hook, dict):
            yield from (str(arg) for arg in hook.get("args") or [])


def _device_nodes(edits: Any) -> list[str]:
    if not isinstance(edits, dict):
        return []
    return [n["path"] for n in edits.get("deviceNodes") or [] if isinstance(n, dict) and isinstance(n.get("path"), str)]


def is_gpu_kind(kind: str) -> bool:
    """``vendor.com/class`` whose class names a GPU (``gpu``, ``orin-gpu``, ``igpu``)."""
    return "gpu" in kind.rpartition("/")[2].lower()


def parse_cdi_spec(text: str, path: str = "") -> CdiSpec:
    """A CDI spec (YAML or JSON); ``ValueError`` when the text is not one."""
    try:
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ValueError(f"not valid {'JSON' if path.endswith('.json') else 'YAML'}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str) or "/" not in data["kind"]:
        raise ValueError("not a CDI spec (no vendor.com/class kind)")
    kind = data["kind"]
    devices: list[CdiDevice] = []
    strings = list(_edit_strings(data.get("containerEdits")))
    for entry in data.get("devices") or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), (str, int)):
            continue
        edits = entry.get("containerEdits")
        gpu = is_gpu_kind(kind) or any(_GPU_NODE.match(n) for n in _device_nodes(edits))
        devices.append(CdiDevice(kind, str(entry["name"]), gpu))
        if gpu:
            strings.extend(_edit_strings(edits))
    apis = frozenset(api for api, mark in _API_MARKS.items() if any(mark.search(s) for s in strings))
    return CdiSpec(path, kind, tuple(devices), apis if any(d.gpu for d in devices) else frozenset())


@dataclass(frozen=True)
class Survey:
    usable: bool
    evidence: str
    apis: tuple[str, ...] = ()
    specs: tuple[CdiSpec, ...] = ()


def containers_evidence(specs: Sequence[CdiSpec], problems: Sequence[str], where: str) -> Survey:
    """Usable when a spec exposes a GPU device; the APIs are those of such specs."""
    with_gpus = [s for s in specs if s.gpus]
    if with_gpus:
        parts = []
        for spec in with_gpus:
            gives = f", giving {', '.join(sorted(spec.apis))}" if spec.apis else ", giving no GPU API it can name"
            parts.append(f"{', '.join(d.qualified for d in spec.gpus)} from {spec.path}{gives}")
        apis = tuple(sorted(set().union(*(s.apis for s in with_gpus))))
        return Survey(True, "; ".join(parts), apis, tuple(specs))
    trouble = f" ({'; '.join(problems)})" if problems else ""
    if not specs:
        return Survey(False, f"no CDI spec in {where}{trouble}")
    listed = "; ".join(f"{', '.join(d.qualified for d in s.devices) or 'no devices'} from {s.path}" for s in specs)
    return Survey(False, f"the CDI specs expose no GPU device: {listed}{trouble}", (), tuple(specs))


class ContainersProbe(HostProbe):
    """Usable when a CDI spec exposes a GPU device to containers."""

    Options = ContainersOptions

    def survey(self) -> Survey:
        specs: list[CdiSpec] = []
        problems: list[str] = []
        dirs: Sequence[str] = self.options.spec_dirs  # type: ignore[attr-defined]
        for folder in dirs:
            root = self.host_path(folder)
            try:
                files = sorted(p for p in root.iterdir() if p.suffix in SPEC_SUFFIXES and p.is_file())
            except OSError:
                continue
            for file in files:
                shown = f"{folder.rstrip('/')}/{file.name}"
                try:
                    specs.append(parse_cdi_spec(file.read_text(encoding="utf-8", errors="replace"), shown))
                except (OSError, ValueError) as exc:
                    problems.append(f"{shown}: {exc}")
        return containers_evidence(specs, problems, ", ".join(dirs))

    def apis(self) -> list[str]:
        """The GPU APIs a container gets through the host's CDI specs (empty when none exposes a GPU)."""
        return list(self.survey().apis)

    def check(self) -> tuple[bool, str]:
        result = self.survey()
        return result.usable, result.evidence
