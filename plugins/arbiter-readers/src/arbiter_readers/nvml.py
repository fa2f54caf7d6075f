"""``nvml``: per-process GPU utilisation and memory of NVIDIA GPUs through NVML.

NVML does not count busy time per process.  ``nvmlDeviceGetProcessUtilization`` returns
*samples*: a process's SM, encoder and decoder utilisation (percent) over the driver's last
sample period, stamped with the CPU time (µs) it was taken, for processes that used the GPU
in that period, newer than the timestamp the caller passes.  The reader turns them into the
cumulative busy ns the daemon expects: each sample adds ``util / 100 × the time it covers``,
and the newest timestamp per device is passed back next time so no sample counts twice.

MIG partitions have no per-process utilisation in NVML; with MIG enabled on a device the
reader cannot tell who uses it or how much, so every asked process reads as unreadable
(the daemon then fails safe).

``pynvml`` (the ``nvidia-ml-py`` distribution) is imported only when the reader first
reads, so hosts without it load the plugin fine; tests pass a stand-in module instead.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from arbiter.plugin import GpuReading, KindOptions, PluginContext, ProcessGpu, Reader

#: engine name → the sample's field
ENGINES = (("sm", "smUtil"), ("enc", "encUtil"), ("dec", "decUtil"))
#: what NVML reports for a process's memory it cannot tell (pynvml may pass it through)
NOT_AVAILABLE = (1 << 64) - 1
#: NVML's return code for "no sample newer than the timestamp given"
ERROR_NOT_FOUND = 6
NOT_INSTALLED_WHY = "nvidia-ml-py is not installed"
#: how long after a failed start (no module, no driver) the reader tries again
RETRY_NS = 30_000_000_000


def _wall_us() -> int:
    return time.time_ns() // 1000


# --- samples → busy time (pure) -------------------------------------------------------------


def sample_utils(sample: Any) -> dict[str, int] | None:
    """A sample's utilisation per engine, or None when a value is over 100 (NVML reports
    such garbage for some processes; it cannot be a share of the period)."""
    utils = {engine: int(getattr(sample, attr, 0) or 0) for engine, attr in ENGINES}
    if any(value > 100 or value < 0 for value in utils.values()):
        return None
    return utils


def integrate(samples: Iterable[Any], since_us: int) -> tuple[dict[int, dict[str, float]], int]:
    """Busy ns per pid and engine that ``samples`` add, and the newest timestamp among them.

    A sample covers the time since the same pid's previous sample in this batch; a pid's
    first sample covers the time since ``since_us`` (the newest timestamp of the previous
    read).  It never reaches further back: NVML only returns samples for processes that were
    busy, so a pid idle for an hour would otherwise be charged for the whole hour.
    """
    added: dict[int, dict[str, float]] = {}
    previous: dict[int, int] = {}
    newest = since_us
    for sample in sorted(samples, key=lambda s: int(s.timeStamp)):
        stamp = int(sample.timeStamp)
        newest = max(newest, stamp)
        utils = sample_utils(sample)
        if utils is None:
            continue
        pid = int(sample.pid)
        start = max(previous.get(pid, since_us), since_us)
        if stamp <= start:
            continue
        span_ns = (stamp - start) * 1000
        previous[pid] = stamp
        busy = added.setdefault(pid, {})
        for engine, value in utils.items():
            busy[engine] = busy.get(engine, 0.0) + value / 100 * span_ns
    return added, newest


def used_memory(process: Any) -> int | None:
    """A process list entry's ``usedGpuMemory`` in bytes, or None where NVML cannot tell
    (Windows WDDM, some MIG and container setups)."""
    value = getattr(process, "usedGpuMemory", None)
    if value is None or int(value) >= NOT_AVAILABLE or int(value) < 0:
        return None
    return int(value)


# --- the reader ---------------------------------------------------------------------------


class NvmlOptions(KindOptions):
    kind: Literal["nvml"] = "nvml"


@dataclass
class _Device:
    """One GPU: its handle, its engines' names, and the newest sample timestamp read from it."""

    index: int
    handle: Any
    last_seen_us: int
    name: str = ""

    def engine(self, name: str) -> str:
        # the first GPU's engines keep plain names; another GPU's are told apart, so the
        # daemon's "busiest engine" is never the sum of two devices
        return name if self.index == 0 else f"{name}@{self.index}"


class NvmlReader(Reader):
    """Reads NVIDIA GPUs through NVML: per-process busy time (sm, enc, dec) and memory."""

    preference = 10

    Options = NvmlOptions

    def __init__(
        self,
        options: NvmlOptions,
        context: PluginContext,
        *,
        nvml: Any = None,
        wall_us: Callable[[], int] = _wall_us,
    ) -> None:
        super().__init__(options, context)
        self._module = nvml  # a stand-in module for tests; None imports pynvml when first needed
        self._wall_us = wall_us
        self._lock = threading.Lock()  # the daemon may read from more than one worker thread
        self._nvml: Any = None  # the module, once nvmlInit succeeded
        self._driver = ""  # the kernel driver's version, as NVML reports it
        self._devices: list[_Device] = []
        self._failed_at: int | None = None
        self._failed_why = ""
        self._busy: dict[int, dict[str, float]] = {}

    def read(self, pids: Collection[int]) -> GpuReading:
        with self._lock:
            return self._read(pids)

    def close(self) -> None:
        with self._lock:
            nvml, self._nvml, self._devices = self._nvml, None, []
            if nvml is not None:
                try:
                    nvml.nvmlShutdown()
                except nvml.NVMLError:
                    pass  # the driver went away; there is nothing left to release

    def _start(self, now_ns: int) -> str:
        """Import pynvml and initialise NVML once; the reason it cannot, or ""."""
        if self._nvml is not None:
            return ""
        if self._failed_at is not None and now_ns - self._failed_at < RETRY_NS:
            return self._failed_why
        why = self._init()
        self._failed_at, self._failed_why = (now_ns, why) if why else (None, "")
        return why

    def _init(self) -> str:
        nvml = self._module
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError:
                return NOT_INSTALLED_WHY
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, OSError, ...: all mean no NVML
            return f"NVML cannot initialise: {exc}"
        try:
            since = self._wall_us()
            self._devices = [
                _Device(i, nvml.nvmlDeviceGetHandleByIndex(i), since) for i in range(nvml.nvmlDeviceGetCount())
            ]
            for device in self._devices:
                device.name = _device_name(nvml, device.handle)
            self._driver = _driver(nvml)
        except nvml.NVMLError as exc:
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError:
                pass
            return f"NVML cannot list the GPUs: {exc}"
        self._nvml = nvml
        return ""

    def _read(self, pids: Collection[int]) -> GpuReading:
        at_ns = time.monotonic_ns()
        why = self._start(at_ns)
        if why:
            return GpuReading(readable=False, at_ns=at_ns, why=why)
        nvml = self._nvml
        asked = set(pids)
        self._busy = {pid: busy for pid, busy in self._busy.items() if pid in asked}
        listed: dict[int, int | None] = {}  # pid → memory over the devices, None where unknown
        present: set[int] = set()  # pids NVML lists or sampled now
        lists_ok = True
        problems: list[str] = []
        readable_devices = 0
        total: int | None = None
        free: int | None = None

        for device in self._devices:
            try:
                memory = nvml.nvmlDeviceGetMemoryInfo(device.handle)
                total = (total or 0) + int(memory.total)
                free = (free or 0) + int(memory.free)
            except nvml.NVMLError:
                pass  # device memory is a nicety; per-process time is what counts
            if self._mig_enabled(nvml, device):
                problems.append(
                    f"MIG mode is enabled on GPU {device.index}: NVML has no per-process utilisation for MIG instances"
                )
                continue
            try:
                samples = nvml.nvmlDeviceGetProcessUtilization(device.handle, device.last_seen_us)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) != getattr(nvml, "NVML_ERROR_NOT_FOUND", ERROR_NOT_FOUND):
                    problems.append(f"NVML cannot read per-process utilisation of GPU {device.index}: {exc}")
                    continue
                samples = []  # no sample newer than the last one seen: nobody was busy
            added, device.last_seen_us = integrate(samples, device.last_seen_us)
            readable_devices += 1
            for pid, busy in added.items():
                if pid not in asked:
                    continue
                present.add(pid)
                mine = self._busy.setdefault(pid, {})
                for engine, ns in busy.items():
                    mine[device.engine(engine)] = mine.get(device.engine(engine), 0.0) + ns
            on_device: dict[int, int | None] = {}
            for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                try:
                    entries = getattr(nvml, getter)(device.handle)
                except nvml.NVMLError:
                    lists_ok = False
                    continue
                for process in entries:
                    pid = int(process.pid)
                    if pid not in asked:
                        continue
                    memory_bytes = used_memory(process)
                    # a process with both a compute and a graphics context is listed twice
                    # with the same memory: take it once
                    if pid not in on_device:
                        on_device[pid] = memory_bytes
                    elif memory_bytes is not None:
                        on_device[pid] = max(on_device[pid] or 0, memory_bytes)
            for pid, memory_bytes in on_device.items():
                present.add(pid)
                mine = self._busy.setdefault(pid, {})
                for engine, _ in ENGINES:  # listed without a sample: it holds the GPU, idle
                    mine.setdefault(device.engine(engine), 0.0)
                if pid in listed:
                    before = listed[pid]
                    listed[pid] = None if before is None or memory_bytes is None else before + memory_bytes
                else:
                    listed[pid] = memory_bytes

        unreadable = frozenset(asked) if problems else frozenset()
        processes: dict[int, ProcessGpu] = {}
        if not unreadable:
            # a pid seen before and not now has let go of the GPU; it stays, unchanged, so its
            # busy time never seems to restart from zero
            for pid, busy in sorted(self._busy.items()):
                memory_bytes = listed.get(pid, 0 if lists_ok and pid not in present else None)
                processes[pid] = ProcessGpu(
                    busy_ns={engine: round(ns) for engine, ns in busy.items()}, vram_bytes=memory_bytes
                )
        return GpuReading(
            readable=readable_devices > 0,
            at_ns=at_ns,
            processes=processes,
            device="gpu",
            vram_total_bytes=total,
            vram_free_bytes=free,
            why="; ".join(problems) if problems else ("" if self._devices else "NVML lists no GPU"),
            unreadable=unreadable,
            devices=tuple(d.name for d in self._devices if d.name),
            driver=self._driver,
        )

    @staticmethod
    def _mig_enabled(nvml: Any, device: _Device) -> bool:
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(device.handle)
        except (nvml.NVMLError, AttributeError):
            return False  # not a MIG-capable GPU (or a pynvml without MIG)
        return int(current) == 1


def _driver(nvml: Any) -> str:
    """``"nvidia 550.54.15"``; "" where NVML does not say (an old library, a fake without it)."""
    try:
        version = nvml.nvmlSystemGetDriverVersion()
    except Exception:  # a missing function or an NVML error: the fingerprint goes without it
        return ""
    text = version.decode() if isinstance(version, bytes) else str(version)
    return f"nvidia {text}" if text else ""


def _device_name(nvml: Any, handle: Any) -> str:
    try:
        name = nvml.nvmlDeviceGetName(handle)
    except Exception:  # an old driver, or a fake without names: the fingerprint goes without it
        return ""
    return name.decode() if isinstance(name, bytes) else str(name)
