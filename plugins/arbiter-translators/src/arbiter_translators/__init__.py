"""arbiter translator kinds: ``signal`` (pause, resume, terminate, kill), ``cgroup_freeze``
(pause a job's own cgroup v2, else signals), ``control_doc``, ``http_post`` (ask a daemon to
release its VRAM, or to take it back), ``gpu_profile`` (an NVIDIA GPU's power limit and locked
clocks while a tenant works on it) and ``cuda_checkpoint`` (a pause that checkpoints a CUDA
job's device memory through NVIDIA's driver, freeing its VRAM).

Registered through the ``arbiter`` entry point group; imports only :mod:`arbiter.plugin`.
"""

from __future__ import annotations

from collections.abc import Callable

from arbiter.plugin import hookimpl
from arbiter_translators.cgroup import CgroupFreezeTranslator
from arbiter_translators.control import ControlDocTranslator
from arbiter_translators.cuda_checkpoint import CudaCheckpointTranslator
from arbiter_translators.gpu_profile import GpuProfileTranslator
from arbiter_translators.http import HttpPostTranslator
from arbiter_translators.signals import SignalTranslator

__all__ = [
    "CgroupFreezeTranslator",
    "ControlDocTranslator",
    "CudaCheckpointTranslator",
    "GpuProfileTranslator",
    "HttpPostTranslator",
    "SignalTranslator",
    "arbiter_register_translators",
]


@hookimpl
def arbiter_register_translators(register: Callable[[str, type], None]) -> None:
    register("signal", SignalTranslator)
    register("cgroup_freeze", CgroupFreezeTranslator)
    register("control_doc", ControlDocTranslator)
    register("http_post", HttpPostTranslator)
    register("gpu_profile", GpuProfileTranslator)
    register("cuda_checkpoint", CudaCheckpointTranslator)
