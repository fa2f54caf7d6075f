"""Every probe on the machine running the tests: an answer with evidence, never an exception, in time.

On a host without a GPU (CI) each must say it is not usable, and why.  The loader-library paths
(used where vulkaninfo or clinfo is missing) are checked against the real libraries where installed.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from arbiter.plugin import PluginContext
from arbiter_probes import PROBES
from arbiter_probes._host import Completed, run_command
from arbiter_probes.opencl import OpenclProbe
from arbiter_probes.vulkan import VulkanProbe

TIMEOUT_S = 5.0
NO_GPU_NODE = not any(glob.glob(p) for p in ("/dev/nvidia[0-9]*", "/dev/kfd", "/dev/dri/renderD*", "/dev/dxg"))


def _loadable(name: str) -> bool:
    try:
        ctypes.CDLL(name)
    except OSError:
        return False
    return True


@pytest.mark.parametrize("kind", sorted(PROBES))
def test_each_probe_answers_with_evidence_in_time(kind: str, context: PluginContext) -> None:
    cls = PROBES[kind]
    probe = cls(cls.Options(timeout_s=TIMEOUT_S), context)
    started = time.monotonic()
    usable, why = probe.probe()
    elapsed = time.monotonic() - started
    assert isinstance(usable, bool) and isinstance(why, str) and why.strip()
    assert not why.startswith("the probe itself failed"), why
    assert elapsed < 2 * TIMEOUT_S + 2  # at most a command and a child query, each under its timeout
    if kind == "metal" and sys.platform != "darwin":
        assert (usable, why) == (False, "not this platform: Metal exists only on macOS")
    if kind == "directml" and sys.platform != "win32":
        assert (usable, why) == (False, "not this platform: DirectML exists only on Windows")
    if NO_GPU_NODE and kind != "containers":
        assert not usable, why


def _without(program: str) -> Any:
    def run(argv: Sequence[str], timeout_s: float, env: Mapping[str, str]) -> Completed:
        if os.path.basename(argv[0]) == program:
            raise FileNotFoundError(2, "hidden by the test", program)
        return run_command(argv, timeout_s, env)

    return run


@pytest.mark.skipif(not _loadable("libvulkan.so.1"), reason="no Vulkan loader library here")
def test_the_vulkan_loader_is_asked_directly_where_vulkaninfo_is_missing(context: PluginContext) -> None:
    options = VulkanProbe.Options(timeout_s=TIMEOUT_S)
    with_tool = VulkanProbe(options, context).probe()
    usable, why = VulkanProbe(options, context, run=_without("vulkaninfo")).probe()
    assert not why.startswith("the probe itself failed"), why
    if with_tool[1].startswith("only a CPU device: "):  # vulkaninfo saw the same devices
        assert (usable, why) == with_tool


@pytest.mark.skipif(not _loadable("libOpenCL.so.1"), reason="no OpenCL ICD loader library here")
def test_the_icd_loader_is_asked_directly_where_clinfo_is_missing(context: PluginContext) -> None:
    options = OpenclProbe.Options(timeout_s=TIMEOUT_S)
    with_tool = OpenclProbe(options, context).probe()
    usable, why = OpenclProbe(options, context, run=_without("clinfo")).probe()
    assert not why.startswith("the probe itself failed"), why
    if with_tool[1].startswith("only a CPU device: "):
        assert (usable, why) == with_tool
