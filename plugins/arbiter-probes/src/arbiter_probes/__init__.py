"""arbiter probe kinds: is a GPU API usable on this host, with the evidence in plain words.

- ``cuda``: NVML's device count and names, else the CUDA driver's ``cuInit`` and device count;
- ``rocm``: ``/dev/kfd`` and a KFD topology node with SIMDs, else ``rocminfo``'s GPU agents;
- ``vulkan``: driver manifests on the loader's search path (``VK_DRIVER_FILES`` and friends), then
  devices from ``vulkaninfo --summary`` or the loader; a CPU device (llvmpipe) does not count;
- ``opencl``: ICD files (``/etc/OpenCL/vendors``, ``OCL_ICD_VENDORS``), then devices from ``clinfo``
  or the ICD loader; only GPU devices count (PoCL's CPU device does not);
- ``metal``: ``system_profiler SPDisplaysDataType`` on macOS; "not this platform" elsewhere;
- ``directml``: a hardware Direct3D 12 adapter on Windows; "not this platform" elsewhere;
- ``containers``: the GPU devices the host's CDI specs expose, and the APIs they give a container.

Each probe's ``probe()`` returns ``(usable, evidence)`` and never raises.  Native libraries are
asked in a child process and every command runs without a shell under ``timeout_s`` (5 s).
Registered through the ``arbiter`` entry point group; imports only :mod:`arbiter.plugin`.
"""

from __future__ import annotations

from arbiter.plugin import Register, hookimpl
from arbiter_probes.containers import ContainersProbe
from arbiter_probes.cuda import CudaProbe
from arbiter_probes.directml import DirectmlProbe
from arbiter_probes.metal import MetalProbe
from arbiter_probes.opencl import OpenclProbe
from arbiter_probes.rocm import RocmProbe
from arbiter_probes.vulkan import VulkanProbe

__all__ = [
    "ContainersProbe",
    "CudaProbe",
    "DirectmlProbe",
    "MetalProbe",
    "OpenclProbe",
    "RocmProbe",
    "VulkanProbe",
    "arbiter_register_probes",
]

PROBES = {
    "cuda": CudaProbe,
    "rocm": RocmProbe,
    "vulkan": VulkanProbe,
    "opencl": OpenclProbe,
    "metal": MetalProbe,
    "directml": DirectmlProbe,
    "containers": ContainersProbe,
}


@hookimpl
def arbiter_register_probes(register: Register) -> None:
    for name, cls in PROBES.items():
        register(name, cls)
