"""arbiter reader kinds: per-process GPU busy time and VRAM, and the device's VRAM.

- ``drm_fdinfo``: Linux DRM drivers' per-client usage in ``/proc/PID/fdinfo``;
- ``nvml``: NVIDIA GPUs through NVML (``nvidia-ml-py``, imported only when read);
- ``macos_ioreg``: Apple-silicon GPUs through the IO registry (``ioreg``);
- ``cpu_time``: a CPU stand-in for a GPU reader (demos and tests).

Registered through the ``arbiter`` entry point group; imports only :mod:`arbiter.plugin`.
"""

from __future__ import annotations

from collections.abc import Callable

from arbiter.plugin import hookimpl
from arbiter_readers.cpu_time import CpuTimeReader
from arbiter_readers.drm_fdinfo import DrmFdinfoReader
from arbiter_readers.macos_ioreg import MacosIoregReader
from arbiter_readers.nvml import NvmlReader

__all__ = ["CpuTimeReader", "DrmFdinfoReader", "MacosIoregReader", "NvmlReader", "arbiter_register_readers"]


@hookimpl
def arbiter_register_readers(register: Callable[[str, type], None]) -> None:
    register("cpu_time", CpuTimeReader)
    register("drm_fdinfo", DrmFdinfoReader)
    register("nvml", NvmlReader)
    register("macos_ioreg", MacosIoregReader)
