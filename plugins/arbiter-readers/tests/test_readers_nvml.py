"""The ``nvml`` reader against a stand-in pynvml that replays recorded sample arrays.

There is no NVIDIA GPU here; the stand-in answers the calls the reader makes the way
pynvml does (objects with NVML's field names, ``NVMLError`` with ``.value``, NOT_FOUND when
no sample is newer than the timestamp given) and records what it was asked.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from arbiter.plugin import PluginContext
from arbiter_readers.nvml import NOT_AVAILABLE, NOT_INSTALLED_WHY, NvmlReader, integrate, sample_utils
from arbiter_testing.fake_nvml import FakeNVMLError, FakePynvmlBase

GiB = 1 << 30
T0 = 1_722_000_000_000_000  # µs: when the reader started NVML


def sample(pid: int, at_us: int, sm: int = 0, enc: int = 0, dec: int = 0, mem: int = 0) -> SimpleNamespace:
    return SimpleNamespace(pid=pid, timeStamp=at_us, smUtil=sm, memUtil=mem, encUtil=enc, decUtil=dec)


def proc(pid: int, used: int | None) -> SimpleNamespace:
    return SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)


@dataclass
class FakeGpu:
    #: sample arrays, one per nvmlDeviceGetProcessUtilization call (NVML returns those newer
    #: than the timestamp given; an empty answer is NOT_FOUND)
    batches: list[list[SimpleNamespace]] = field(default_factory=list)
    compute: list[SimpleNamespace] = field(default_factory=list)
    graphics: list[SimpleNamespace] = field(default_factory=list)
    mig: int | None = None  # None: not a MIG-capable GPU (NVML says Not Supported)
    total: int = 80 * GiB
    free: int = 60 * GiB


class FakePynvml(FakePynvmlBase):
    """Stands in for the ``pynvml`` module."""

    def __init__(self, gpus: Sequence[FakeGpu], init_error: int | None = None) -> None:
        super().__init__(gpus, init_error)
        self.asked: list[tuple[int, int]] = []  # (device, lastSeenTimeStamp) per utilisation call

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        if self.gpus[handle].mig is None:
            raise FakeNVMLError(3)
        return [self.gpus[handle].mig, self.gpus[handle].mig]

    def nvmlDeviceGetProcessUtilization(self, handle: int, last_seen: int) -> list[SimpleNamespace]:
        self.asked.append((handle, last_seen))
        batches = self.gpus[handle].batches
        newer = [s for s in (batches.pop(0) if batches else []) if s.timeStamp > last_seen]
        if not newer:
            raise FakeNVMLError(6)
        return newer

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        gpu: FakeGpu = self.gpus[handle]
        return gpu.compute

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        gpu: FakeGpu = self.gpus[handle]
        return gpu.graphics

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        gpu = self.gpus[handle]
        return SimpleNamespace(total=gpu.total, free=gpu.free, used=gpu.total - gpu.free)


def reader(nvml: Any) -> NvmlReader:
    options = NvmlReader.Options.model_validate({"kind": "nvml"})
    return NvmlReader(options, PluginContext(state_dir=Path(".")), nvml=nvml, wall_us=lambda: T0)


def test_options_take_no_fields() -> None:
    NvmlReader.Options.model_validate({})
    with pytest.raises(ValidationError):
        NvmlReader.Options.model_validate({"kind": "nvml", "device": 0})


def test_samples_become_cumulative_busy_time_carried_between_reads() -> None:
    gpu = FakeGpu(
        batches=[
            [
                sample(100, T0 + 500_000, sm=40),
                sample(100, T0 + 1_000_000, sm=60, enc=10),
                sample(200, T0 + 1_200_000, sm=4294967295),  # garbage NVML sometimes reports: dropped
                sample(300, T0 + 900_000, sm=90),  # not asked about
            ],
            [sample(100, T0 + 3_000_000, sm=50), sample(200, T0 + 2_200_000, sm=100, dec=101)],
            [],  # nobody busy: NOT_FOUND
        ],
        compute=[proc(100, 2 * GiB), proc(200, GiB), proc(300, 5 * GiB)],
        graphics=[proc(100, 2 * GiB)],  # compute and graphics contexts: the same memory, once
    )
    nvml = FakePynvml([gpu])
    r = reader(nvml)

    one = r.read([100, 200, 400])
    assert one.readable and one.device == "gpu" and one.unreadable == frozenset()
    # 40% of 0.5 s since NVML started, then 60% (and enc 10%) of the next 0.5 s
    assert one.processes[100].busy_ns == {"sm": 500_000_000, "enc": 50_000_000, "dec": 0}
    assert one.processes[100].vram_bytes == 2 * GiB
    # listed but its only sample was garbage: holds the GPU, busy 0
    assert one.processes[200].busy_ns == {"sm": 0, "enc": 0, "dec": 0}
    assert one.processes[200].vram_bytes == GiB
    assert set(one.processes) == {100, 200}  # 400 holds nothing; 300 was not asked about
    assert one.vram_total_bytes == 80 * GiB and one.vram_free_bytes == 60 * GiB

    two = r.read([100, 200, 400])
    # the newest timestamp seen (the dropped sample's included) is the next call's lastSeen
    assert nvml.asked[:2] == [(0, T0), (0, T0 + 1_200_000)]
    assert two.processes[100].busy_ns["sm"] == 500_000_000 + 1_800_000_000 // 2
    assert two.processes[200].busy_ns == {"sm": 0, "enc": 0, "dec": 0}  # dec 101: dropped whole

    three = r.read([100, 200, 400])
    assert nvml.asked[2] == (0, T0 + 3_000_000)
    assert three.readable and three.processes[100].busy_ns == two.processes[100].busy_ns


def test_a_process_that_lets_go_stays_unchanged() -> None:
    gpu = FakeGpu(batches=[[sample(100, T0 + 1_000_000, sm=50)]], compute=[proc(100, GiB)])
    r = reader(FakePynvml([gpu]))
    before = r.read([100]).processes[100]
    gpu.compute = []
    after = r.read([100]).processes[100]
    assert after.busy_ns == before.busy_ns == {"sm": 500_000_000, "enc": 0, "dec": 0}
    assert after.vram_bytes == 0


def test_memory_nvml_cannot_tell_is_none() -> None:
    gpu = FakeGpu(compute=[proc(100, None), proc(200, NOT_AVAILABLE)])
    reading = reader(FakePynvml([gpu])).read([100, 200])
    assert reading.processes[100].vram_bytes is None and reading.processes[200].vram_bytes is None
    assert reading.processes[100].busy_ns == {"sm": 0, "enc": 0, "dec": 0}


def test_two_gpus_keep_their_engines_apart_and_sum_memory() -> None:
    gpus = [
        FakeGpu(batches=[[sample(100, T0 + 1_000_000, sm=100)]], compute=[proc(100, GiB)]),
        FakeGpu(batches=[[sample(100, T0 + 1_000_000, sm=50)]], compute=[proc(100, 3 * GiB)], total=GiB, free=0),
    ]
    reading = reader(FakePynvml(gpus)).read([100])
    busy = reading.processes[100].busy_ns
    assert busy["sm"] == 1_000_000_000 and busy["sm@1"] == 500_000_000
    assert reading.processes[100].vram_bytes == 4 * GiB
    assert reading.vram_total_bytes == 81 * GiB and reading.vram_free_bytes == 60 * GiB


def test_mig_makes_every_asked_process_unreadable() -> None:
    plain = FakeGpu(batches=[[sample(100, T0 + 1_000_000, sm=50)]], compute=[proc(100, GiB)], mig=0)
    partitioned = FakeGpu(compute=[proc(200, GiB)], mig=1)
    nvml = FakePynvml([plain, partitioned])
    reading = reader(nvml).read([100, 200])
    assert reading.readable  # GPU 0 reads, but nobody can say who uses GPU 1
    assert reading.unreadable == frozenset({100, 200}) and reading.processes == {}
    assert "MIG mode is enabled on GPU 1" in reading.why
    assert all(device == 0 for device, _ in nvml.asked)  # no utilisation asked of a MIG GPU

    only = reader(FakePynvml([FakeGpu(mig=1)])).read([100])
    assert not only.readable and only.unreadable == frozenset({100}) and "MIG" in only.why


def test_pynvml_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    options = NvmlReader.Options.model_validate({"kind": "nvml"})
    reading = NvmlReader(options, PluginContext(state_dir=Path("."))).read([1])
    assert not reading.readable and reading.why == NOT_INSTALLED_WHY == "nvidia-ml-py is not installed"


def test_nvml_that_cannot_start() -> None:
    nvml = FakePynvml([FakeGpu()], init_error=9)
    r = reader(nvml)
    reading = r.read([1])
    assert not reading.readable and reading.why == "NVML cannot initialise: Driver Not Loaded"
    assert r.read([1]).why == reading.why  # not retried on every read
    r.close()
    assert nvml.shutdowns == 0  # never started: nothing to shut down


def test_init_once_and_shutdown_on_close() -> None:
    nvml = FakePynvml([FakeGpu()])
    r = reader(nvml)
    r.read([1])
    r.read([1])
    assert nvml.inits == 1
    r.close()
    r.close()
    assert nvml.shutdowns == 1


def test_no_gpu_listed_is_not_readable() -> None:
    reading = reader(FakePynvml([])).read([1])
    assert not reading.readable and reading.why == "NVML lists no GPU"


def test_sample_values_over_100_are_dropped() -> None:
    assert sample_utils(sample(1, 0, sm=100, enc=100, dec=100)) == {"sm": 100, "enc": 100, "dec": 100}
    assert sample_utils(sample(1, 0, sm=101)) is None
    assert sample_utils(sample(1, 0, enc=4294967295)) is None


def test_a_first_sample_never_reaches_before_the_last_read() -> None:
    added, newest = integrate([sample(7, 2_000_000, sm=50), sample(7, 2_250_000, sm=100)], since_us=1_000_000)
    assert newest == 2_250_000
    assert added[7]["sm"] == 0.5 * 1_000_000_000 + 1.0 * 250_000_000
    added, newest = integrate([sample(7, 900_000, sm=50)], since_us=1_000_000)  # not newer: nothing
    assert added == {} and newest == 1_000_000


def test_the_driver_version_is_in_the_reading_where_nvml_says_it() -> None:
    """pynvml's nvmlSystemGetDriverVersion returns a str (bytes in its old releases); a library
    without it, or one that fails, leaves the driver unknown ("")."""

    class WithDriver(FakePynvml):
        def __init__(self, gpus: Sequence[FakeGpu], version: Any) -> None:
            super().__init__(gpus)
            self.version = version

        def nvmlSystemGetDriverVersion(self) -> Any:
            if isinstance(self.version, int):
                raise FakeNVMLError(self.version)
            return self.version

    assert reader(WithDriver([FakeGpu()], "550.54.15")).read([]).driver == "nvidia 550.54.15"
    assert reader(WithDriver([FakeGpu()], b"535.183.01")).read([]).driver == "nvidia 535.183.01"
    assert reader(WithDriver([FakeGpu()], 3)).read([]).driver == ""
    assert reader(FakePynvml([FakeGpu()])).read([]).driver == ""
