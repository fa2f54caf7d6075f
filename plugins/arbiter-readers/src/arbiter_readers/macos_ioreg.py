"""``macos_ioreg``: per-process GPU time of Apple-silicon GPUs from the IO registry.

Every Metal device a process opens is an ``AGXDeviceUserClient`` in the IO registry, a child
of the GPU's accelerator, readable by any account.  Its ``IOUserClientCreator`` names the
process (``"pid 440, WindowServer"``) and its ``AppUsage`` array holds one record per API
with ``accumulatedGPUTime``, cumulative GPU ns (what Activity Monitor's GPU column shows).
The accelerator's ``PerformanceStatistics`` give the memory the GPU has allocated and uses;
Apple silicon has no VRAM of its own, so that is the closest thing to device memory.

The reader runs ``/usr/sbin/ioreg`` (no shell, with a timeout) rather than walking IOKit
through ctypes: the text is stable, and the parsing stays in pure functions that tests run
on captured output on any OS.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import dataclass
from typing import Literal

from arbiter.plugin import GpuReading, KindOptions, PluginContext, ProcessGpu, Reader, run_child
from arbiter_readers._ledger import Ledger

IOREG = "/usr/sbin/ioreg"
CLIENT_CLASS = "AGXDeviceUserClient"
ACCELERATOR_CLASS = "IOAccelerator"
ENGINE = "gpu"
TIMEOUT_S = 5.0
NOT_MACOS_WHY = "not macOS"
NO_CLIENT_WHY = f"no {CLIENT_CLASS} in the IO registry: no Apple-silicon GPU client here, so no per-process GPU time"

_ENTRY = re.compile(r"^[ \t|]*\+-o ", re.MULTILINE)
_OBJECT_ID = re.compile(r"\bid (0x[0-9a-fA-F]+)")
_CREATOR = re.compile(r'"IOUserClientCreator"\s*=\s*"pid (\d+),\s*([^"]*)"')
_GPU_TIME = re.compile(r'"accumulatedGPUTime"\s*=\s*(\d+)')
_PERFORMANCE = re.compile(r'"PerformanceStatistics"\s*=\s*\{([^}]*)\}')
_NUMBER_PAIR = re.compile(r'"([^"]+)"\s*=\s*(-?\d+)')


# --- parsing (pure) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AgxClient:
    """One GPU user client: which process made it and the GPU ns it has accumulated."""

    object_id: str | None  # the registry entry's id, stable while the client lives
    pid: int
    name: str
    gpu_ns: int


def _entries(text: str) -> list[str]:
    """The text of each ``+-o`` entry (its header line and its properties)."""
    bounds = [m.start() for m in _ENTRY.finditer(text)] + [len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def parse_user_clients(text: str) -> list[AgxClient]:
    """Every user client in ``ioreg -r -d 1 -w 0 -c AGXDeviceUserClient`` output.

    An entry is parsed whole: ioreg sorts keys, so ``AppUsage`` comes *before* the
    ``IOUserClientCreator`` it belongs to.  Its GPU time is the sum over its ``AppUsage``
    records (one per API); a driver that puts ``accumulatedGPUTime`` on the client itself
    is read the same way.  An entry without a creator names no process and is skipped.
    """
    clients: list[AgxClient] = []
    for entry in _entries(text):
        creator = _CREATOR.search(entry)
        if creator is None:
            continue
        header = entry.split("\n", 1)[0]
        object_id = _OBJECT_ID.search(header)
        clients.append(
            AgxClient(
                object_id=object_id.group(1) if object_id else None,
                pid=int(creator.group(1)),
                name=creator.group(2).strip(),
                gpu_ns=sum(int(n) for n in _GPU_TIME.findall(entry)),
            )
        )
    return clients


def gpu_time_by_pid(clients: Sequence[AgxClient]) -> dict[int, int]:
    """Cumulative GPU ns per process, summed over its clients."""
    by_pid: dict[int, int] = {}
    for client in clients:
        by_pid[client.pid] = by_pid.get(client.pid, 0) + client.gpu_ns
    return by_pid


def parse_performance_statistics(text: str) -> list[dict[str, int]]:
    """The numeric ``PerformanceStatistics`` of each accelerator in ``ioreg -c IOAccelerator`` output."""
    return [
        {key: int(value) for key, value in _NUMBER_PAIR.findall(match.group(1))}
        for match in _PERFORMANCE.finditer(text)
    ]


def accelerator_memory(stats: Sequence[dict[str, int]]) -> tuple[int | None, int | None]:
    """(total, free) bytes: ``Alloc system memory`` and what of it is not ``In use system
    memory``, summed over accelerators that report both; (None, None) when none does."""
    total = free = 0
    found = False
    for one in stats:
        alloc, in_use = one.get("Alloc system memory"), one.get("In use system memory")
        if alloc is None or in_use is None:
            continue
        found = True
        total += alloc
        free += max(0, alloc - in_use)
    return (total, free) if found else (None, None)


# --- the reader ---------------------------------------------------------------------------


class MacosIoregOptions(KindOptions):
    kind: Literal["macos_ioreg"] = "macos_ioreg"


def _run_ioreg(args: Sequence[str]) -> str:
    done: subprocess.CompletedProcess[str] = run_child(
        [IOREG, *args], capture_output=True, text=True, timeout=TIMEOUT_S, check=True, stdin=subprocess.DEVNULL
    )
    return done.stdout


class MacosIoregReader(Reader):
    """Reads each process's Apple-silicon GPU time (engine ``gpu``) from ``ioreg``.

    ``platform`` and ``run`` (which runs ioreg with the given arguments and returns its
    output) are parameters so tests can drive the reader anywhere; the daemon uses the
    defaults.
    """

    preference = 30
    platforms = frozenset({"darwin"})

    Options = MacosIoregOptions

    def __init__(
        self,
        options: MacosIoregOptions,
        context: PluginContext,
        *,
        platform: str = sys.platform,
        run: Callable[[Sequence[str]], str] = _run_ioreg,
    ) -> None:
        super().__init__(options, context)
        self._platform = platform
        self._run = run
        self._lock = threading.Lock()  # the daemon may read from more than one worker thread
        self._ledger: Ledger[Hashable] = Ledger()

    def read(self, pids: Collection[int]) -> GpuReading:
        with self._lock:
            return self._read(pids)

    def _read(self, pids: Collection[int]) -> GpuReading:
        at_ns = time.monotonic_ns()
        if self._platform != "darwin":
            return GpuReading(readable=False, at_ns=at_ns, why=NOT_MACOS_WHY)
        try:
            clients = parse_user_clients(self._run(["-r", "-d", "1", "-w", "0", "-c", CLIENT_CLASS]))
        except (OSError, subprocess.SubprocessError) as exc:
            return GpuReading(readable=False, at_ns=at_ns, why=f"ioreg cannot list {CLIENT_CLASS}: {exc}")
        if not clients:
            return GpuReading(readable=False, at_ns=at_ns, why=NO_CLIENT_WHY)
        try:
            total, free = accelerator_memory(
                parse_performance_statistics(self._run(["-r", "-d", "1", "-w", "0", "-c", ACCELERATOR_CLASS]))
            )
        except (OSError, subprocess.SubprocessError):
            total = free = None  # device memory is a nicety; per-process time is what counts

        asked = set(pids)
        counters: dict[Hashable, tuple[int, dict[str, int]]] = {}
        ordinal: dict[int, int] = {}
        for client in clients:
            if client.pid not in asked:
                continue
            if client.object_id is not None:
                key: Hashable = client.object_id
            else:  # no id in the header: the n-th client of the pid is the best identity there is
                ordinal[client.pid] = ordinal.get(client.pid, 0) + 1
                key = (client.pid, ordinal[client.pid])
            counters[key] = (client.pid, {ENGINE: client.gpu_ns})
        totals = self._ledger.update(counters, keep=asked)
        processes = {pid: ProcessGpu(busy_ns=busy) for pid, busy in sorted(totals.items())}
        return GpuReading(
            readable=True,
            at_ns=at_ns,
            processes=processes,
            device="gpu",
            vram_total_bytes=total,
            vram_free_bytes=free,
        )
