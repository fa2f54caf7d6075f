"""``cuda``: deciding from NVML / CUDA driver reports, and the ctypes queries against fake libraries."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from arbiter_probes import _native
from arbiter_probes._host import Completed
from arbiter_probes.cuda import CudaProbe, cuda_evidence, cuda_version_words
from arbiter_testing.probes import FakeRunner, MakeProbe


def test_cuda_versions_read_as_major_minor() -> None:
    assert cuda_version_words(12040) == "12.4"
    assert cuda_version_words(11080) == "11.8"
    assert cuda_version_words(0) is None and cuda_version_words(None) is None


def test_nvml_devices_are_named_with_the_driver() -> None:
    report = {
        "nvml": {
            "library": "libnvidia-ml.so.1",
            "devices": ["NVIDIA H200"],
            "driver": "550.54.15",
            "cuda_version": 12040,
        }
    }
    assert cuda_evidence(report) == (True, "NVIDIA H200 through libnvidia-ml.so.1, driver 550.54.15 CUDA 12.4")


def test_several_gpus_are_counted_and_listed() -> None:
    report = {"nvml": {"library": "nvml.dll", "devices": ["NVIDIA A10G", "NVIDIA A10G"]}}
    assert cuda_evidence(report) == (True, "2 GPUs: NVIDIA A10G, NVIDIA A10G through nvml.dll")


def test_the_driver_library_answers_where_nvml_is_missing() -> None:
    report = {
        "nvml": {"library": "libnvidia-ml.so.1", "error": "libnvidia-ml.so.1 not found"},
        "cuda": {"library": "libcuda.so.1", "devices": ["NVIDIA GeForce RTX 4070 Laptop GPU"], "cuda_version": 12040},
    }
    assert cuda_evidence(report) == (True, "NVIDIA GeForce RTX 4070 Laptop GPU through libcuda.so.1, driver 12.4")


def test_no_driver_library_at_all() -> None:
    report = {
        "nvml": {"library": "libnvidia-ml.so.1", "error": "libnvidia-ml.so.1 not found"},
        "cuda": {"library": "libcuda.so.1", "error": "libcuda.so.1 not found"},
    }
    assert cuda_evidence(report) == (False, "no NVIDIA driver: libnvidia-ml.so.1 and libcuda.so.1 not found")


def test_a_driver_that_finds_no_gpu_says_so() -> None:
    report = {
        "nvml": {"library": "libnvidia-ml.so.1", "error": "nvmlInit failed: Driver Not Loaded (9)"},
        "cuda": {"library": "libcuda.so.1", "error": "cuInit failed: CUDA_ERROR_NO_DEVICE (100)"},
    }
    assert cuda_evidence(report) == (
        False,
        "nvmlInit failed: Driver Not Loaded (9); cuInit failed: CUDA_ERROR_NO_DEVICE (100)",
    )
    empty = {
        "nvml": {"library": "libnvidia-ml.so.1", "devices": []},
        "cuda": {"library": "libcuda.so.1", "devices": []},
    }
    assert cuda_evidence(empty) == (False, "libnvidia-ml.so.1 finds no GPU; libcuda.so.1 finds no GPU")


def test_the_probe_asks_a_child_with_its_timeout(make_probe: MakeProbe) -> None:
    run = FakeRunner({"native:cuda": {"nvml": {"library": "libnvidia-ml.so.1", "devices": ["NVIDIA L4"]}}})
    probe = make_probe(CudaProbe, run=run, env={"LD_LIBRARY_PATH": "/opt/nv"}, timeout_s=3)
    assert probe.probe() == (True, "NVIDIA L4 through libnvidia-ml.so.1")
    argv, timeout_s, env = run.calls[0]
    assert argv[1:3] == ["-I", "-S"] and argv[-2].endswith("_native.py") and argv[-1] == "cuda"
    assert timeout_s == 3 and env == {"LD_LIBRARY_PATH": "/opt/nv"}


def test_a_child_that_crashes_in_the_driver_is_not_usable(make_probe: MakeProbe) -> None:
    run = FakeRunner({"native:cuda": Completed(-11, "", "")})
    usable, why = make_probe(CudaProbe, run=run).probe()
    assert not usable
    assert why == "the NVIDIA driver query failed: a child Python process failed (exit -11): no output"


# --- the ctypes queries, against fake libraries ------------------------------------------------------


class Fn:
    """A fake C function: callable, with settable ``restype``/``argtypes``."""

    def __init__(self, body: Callable[..., Any]) -> None:
        self.body = body
        self.restype: Any = None
        self.argtypes: Any = None

    def __call__(self, *args: Any) -> Any:
        return self.body(*args)


def put(ref: Any, value: Any) -> int:
    ref._obj.value = value
    return 0


def fake_nvml(names: list[str], init_rc: int = 0) -> SimpleNamespace:
    def name(handle: ctypes.c_void_p, buf: Any, size: int) -> int:
        assert handle.value is not None
        buf.value = names[handle.value - 1].encode()
        return 0

    def driver(buf: Any, size: int) -> int:
        buf.value = b"550.54.15"
        return 0

    return SimpleNamespace(
        nvmlInit_v2=Fn(lambda: init_rc),
        nvmlShutdown=Fn(lambda: 0),
        nvmlErrorString=Fn(lambda rc: b"Driver Not Loaded"),
        nvmlSystemGetDriverVersion=Fn(driver),
        nvmlSystemGetCudaDriverVersion_v2=Fn(lambda ref: put(ref, 12040)),
        nvmlDeviceGetCount_v2=Fn(lambda ref: put(ref, len(names))),
        nvmlDeviceGetHandleByIndex_v2=Fn(lambda index, ref: put(ref, index + 1)),
        nvmlDeviceGetName=Fn(name),
    )


def fake_cuda(names: list[str], init_rc: int = 0) -> SimpleNamespace:
    def name(buf: Any, size: int, device: ctypes.c_int) -> int:
        buf.value = names[device.value].encode()
        return 0

    return SimpleNamespace(
        cuDriverGetVersion=Fn(lambda ref: put(ref, 12040)),
        cuInit=Fn(lambda flags: init_rc),
        cuGetErrorName=Fn(lambda rc, ref: put(ref, b"CUDA_ERROR_NO_DEVICE")),
        cuDeviceGetCount=Fn(lambda ref: put(ref, len(names))),
        cuDeviceGet=Fn(lambda ref, index: put(ref, index)),
        cuDeviceGetName=Fn(name),
    )


def use_libraries(monkeypatch: pytest.MonkeyPatch, libraries: dict[str, Any]) -> None:
    def load(names: list[str]) -> tuple[Any, str, str]:
        for name in names:
            if name in libraries:
                return libraries[name], name, ""
        return None, names[0], f"{names[0]} not found"

    monkeypatch.setattr(_native, "NVML_NAMES", ["libnvidia-ml.so.1"])
    monkeypatch.setattr(_native, "CUDA_NAMES", ["libcuda.so.1"])
    monkeypatch.setattr(_native, "_load", load)


def test_nvml_query_names_every_device(monkeypatch: pytest.MonkeyPatch) -> None:
    use_libraries(monkeypatch, {"libnvidia-ml.so.1": fake_nvml(["NVIDIA H200", "NVIDIA H100 80GB HBM3"])})
    report = _native.query_cuda()
    assert report == {
        "nvml": {
            "library": "libnvidia-ml.so.1",
            "driver": "550.54.15",
            "cuda_version": 12040,
            "devices": ["NVIDIA H200", "NVIDIA H100 80GB HBM3"],
        }
    }
    assert cuda_evidence(report) == (
        True,
        "2 GPUs: NVIDIA H200, NVIDIA H100 80GB HBM3 through libnvidia-ml.so.1, driver 550.54.15 CUDA 12.4",
    )


def test_nvml_that_cannot_start_falls_back_to_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    use_libraries(monkeypatch, {"libnvidia-ml.so.1": fake_nvml([], init_rc=9), "libcuda.so.1": fake_cuda(["Orin"])})
    report = _native.query_cuda()
    assert report["nvml"] == {"library": "libnvidia-ml.so.1", "error": "nvmlInit failed: Driver Not Loaded (9)"}
    assert report["cuda"] == {"library": "libcuda.so.1", "cuda_version": 12040, "devices": ["Orin"]}
    assert cuda_evidence(report) == (True, "Orin through libcuda.so.1, driver 12.4")


def test_cuinit_failure_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    use_libraries(monkeypatch, {"libcuda.so.1": fake_cuda([], init_rc=100)})
    report = _native.query_cuda()
    assert report["cuda"]["error"] == "cuInit failed: CUDA_ERROR_NO_DEVICE (100)"
    assert cuda_evidence(report) == (False, "libnvidia-ml.so.1 not found; cuInit failed: CUDA_ERROR_NO_DEVICE (100)")


def test_the_real_native_child_runs_on_this_host(make_probe: MakeProbe) -> None:
    from arbiter_probes._host import run_command

    usable, why = make_probe(CudaProbe, run=run_command, env={"PATH": ""}).probe()
    assert isinstance(usable, bool) and why
