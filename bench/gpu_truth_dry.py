"""What ``gpu_truth.py`` reads the GPU through, and the stand-ins its dry run uses.

:class:`ReadOnlyNvml` wraps the real ``pynvml`` and refuses every call that changes a
device (power limit, clocks, compute mode, MIG, persistence, ECC, resets): the script only
reads.  :class:`SimulatedNvml` answers the calls the script and the ``nvml`` reader make,
for a dry run on a host without a GPU: a process's "utilisation" is its CPU time over the
sample period, its memory what it wrote to the fake reader's board, and a process the fake
driver holds checkpointed holds none.
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil

from arbiter_testing.fake_nvml import NOT_FOUND, FakeNVMLError, FakePynvmlBase
from arbiter_testing.vram_board import VramBoard

#: calls that change a device: never made, refused by name
#: how often the stand-in samples, as the driver does (about 1/6 s on recent GPUs)
SAMPLE_PERIOD_US = 100_000
CHANGES = ("nvmlDeviceSet", "nvmlDeviceReset", "nvmlDeviceClear", "nvmlDeviceCreate", "nvmlDeviceDestroy", "nvmlSet")


class DeviceChangeRefused(RuntimeError):
    pass


class ReadOnlyNvml:
    """A pynvml module that only reads (see the module)."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        if name.startswith(CHANGES):
            raise DeviceChangeRefused(
                f"{name} would change the GPU's settings; this script only reads the device (power limit, clocks, "
                "compute mode, MIG and persistence are left as they are)"
            )
        return getattr(self._module, name)


class SimulatedNvml(FakePynvmlBase):
    """One stand-in GPU for the dry run (see the module)."""

    def __init__(self, board: Path, fake_cuda_dir: Path, total_bytes: int) -> None:
        super().__init__([object()])
        self.board = VramBoard(board, total_bytes)
        self.cuda = fake_cuda_dir
        self.total = total_bytes
        self._cpu: dict[int, tuple[float, int]] = {}  # pid → (CPU seconds, wall µs) at its last sample
        self._buffer: deque[SimpleNamespace] = deque(maxlen=500)
        self._last_us = 0

    def nvmlSystemGetDriverVersion(self) -> str:
        return "dry run (no driver)"

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "dry-run stand-in (a CPU core)"

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        raise FakeNVMLError(3)  # not MIG-capable

    def _checkpointed(self, pid: int) -> bool:
        try:
            return (self.cuda / str(pid)).read_text().strip() == "checkpointed"
        except OSError:
            return False

    def _held(self) -> dict[int, int]:
        doc = self.board._read()  # the board's own reader: the same file the work writes
        out = {}
        for pid, entry in doc.get("processes", {}).items():
            if psutil.pid_exists(int(pid)) and not self._checkpointed(int(pid)):
                out[int(pid)] = int(entry.get("vram_bytes") or 0)
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=held) for pid, held in self._held().items()]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        return []

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        used = sum(self._held().values())
        return SimpleNamespace(total=self.total, free=self.total - used, used=used)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        self._sample()
        now_us = time.time_ns() // 1000
        recent = [s for s in self._buffer if s.timeStamp > now_us - 200_000]
        return SimpleNamespace(gpu=min(100, sum(s.smUtil for s in recent)), memory=0)

    def nvmlDeviceGetProcessUtilization(self, handle: int, last_seen_us: int) -> list[SimpleNamespace]:
        self._sample()
        samples = [s for s in self._buffer if s.timeStamp > last_seen_us]
        if not samples:
            raise FakeNVMLError(NOT_FOUND)
        return samples

    def _sample(self) -> None:
        """Like the driver: one sample per process per period, kept in a ring buffer that
        every caller reads (each passing the newest timestamp it has seen)."""
        now_us = time.time_ns() // 1000
        if now_us - self._last_us < SAMPLE_PERIOD_US:
            return
        self._last_us = now_us
        for pid in self._held():
            try:
                cpu = sum(psutil.Process(pid).cpu_times()[:2])
            except psutil.Error:
                continue
            before = self._cpu.get(pid)
            self._cpu[pid] = (cpu, now_us)
            if before is None or now_us <= before[1]:
                continue
            util = round(100 * (cpu - before[0]) / ((now_us - before[1]) / 1e6))
            self._buffer.append(
                SimpleNamespace(
                    pid=pid, timeStamp=now_us, smUtil=max(0, min(100, util)), memUtil=0, encUtil=0, decUtil=0
                )
            )
