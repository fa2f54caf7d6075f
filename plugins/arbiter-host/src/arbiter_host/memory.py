"""``memory``: the host's available memory, as a share of its total.

The node config's memory guard (``memory_guard.min_available``, 0.10 by default) takes GPU
work's budget away while ``available_share`` is below it; this kind only reports.

On Linux the reading is ``MemAvailable`` and ``MemTotal`` from ``/proc/meminfo``, read
directly: one small read, where :func:`psutil.virtual_memory` parses every field and does
more arithmetic.  ``MemAvailable`` is the kernel's own estimate of memory that can be had
without swapping (free memory plus reclaimable caches).  A kernel older than 3.14 has no
``MemAvailable``; there, and on every other OS, psutil's ``available`` is the reading.

``/proc/meminfo`` in a container shows the host's memory, not the container's limit: the
guard protects the host, so that is the number wanted.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psutil

from arbiter.plugin import HostSignal, KindOptions, PluginContext

MEMINFO_SOURCE = "/proc/meminfo"
PSUTIL_SOURCE = "psutil"


@dataclass(frozen=True)
class MemoryReading:
    """Available host memory at one moment.

    ``readable``: whether the numbers below were read (False only when no way of reading
    memory worked; ``why`` then says what failed).

    ``available_share``: ``available_bytes / total_bytes``, between 0 and 1; None when not
    readable.  The memory guard compares this with ``memory_guard.min_available``.

    ``available_bytes``: memory that can be had without swapping (Linux ``MemAvailable``,
    elsewhere psutil's ``available``); None when not readable.

    ``total_bytes``: the host's usable physical memory; None when not readable.

    ``source``: where the numbers came from, ``"/proc/meminfo"`` or ``"psutil"`` (empty when
    not readable).

    ``why``: why it is not readable, or why the cheaper source was not used; empty otherwise.
    """

    readable: bool
    available_share: float | None = None
    available_bytes: int | None = None
    total_bytes: int | None = None
    source: str = ""
    why: str = ""


def meminfo_value(data: bytes, name: str) -> int | None:
    """One field of ``/proc/meminfo`` text in bytes (``MemTotal:  16384 kB`` → 16777216), or None.

    Only the line asked for is looked at: the daemon reads memory on every tick, and
    splitting all fifty-odd lines would cost more than psutil does.  A value without a unit
    (the ``HugePages_*`` counts) is returned as it is.
    """
    key = name.encode() + b":"
    if data.startswith(key):
        at = 0
    else:
        at = data.find(b"\n" + key) + 1  # the line's start, or 0 when there is none
        if at == 0:
            return None
    end = data.find(b"\n", at)
    parts = data[at + len(key) : end if end >= 0 else len(data)].split()
    try:
        value = int(parts[0])
    except (IndexError, ValueError):
        return None
    return value * 1024 if len(parts) > 1 and parts[1].lower() == b"kb" else value


def _reading(available: int, total: int, source: str, why: str = "") -> MemoryReading:
    available = max(0, min(available, total))
    return MemoryReading(
        readable=True,
        available_share=available / total,
        available_bytes=available,
        total_bytes=total,
        source=source,
        why=why,
    )


class MemoryOptions(KindOptions):
    kind: Literal["memory"] = "memory"


class MemoryHostSignal(HostSignal):
    """Reads available host memory; :meth:`read` returns a :class:`MemoryReading`.

    ``platform``, ``proc_root`` (the folder holding ``meminfo``) and ``virtual_memory`` (what
    psutil's :func:`~psutil.virtual_memory` would return) are parameters so tests can fake a
    host; the daemon uses the defaults.
    """

    Options = MemoryOptions

    def __init__(
        self,
        options: MemoryOptions,
        context: PluginContext,
        *,
        platform: str = sys.platform,
        proc_root: str | Path = "/proc",
        virtual_memory: Callable[[], Any] = psutil.virtual_memory,
    ) -> None:
        super().__init__(options, context)
        self._linux = platform.startswith("linux")
        self._meminfo = Path(proc_root) / "meminfo"
        self._virtual_memory = virtual_memory

    def read(self) -> MemoryReading:
        why = ""
        if self._linux:
            reading, why = self._read_meminfo()
            if reading is not None:
                return reading
        return self._read_psutil(why)

    def _read_meminfo(self) -> tuple[MemoryReading | None, str]:
        try:
            with open(self._meminfo, "rb") as fh:
                data = fh.read()
        except OSError as exc:
            return None, f"cannot read {self._meminfo}: {exc.strerror or exc}"
        total = meminfo_value(data, "MemTotal")
        available = meminfo_value(data, "MemAvailable")
        if total is None or total <= 0:
            return None, f"no MemTotal in {self._meminfo}"
        if available is None:
            return None, f"no MemAvailable in {self._meminfo} (a kernel older than 3.14)"
        return _reading(available, total, MEMINFO_SOURCE), ""

    def _read_psutil(self, why: str) -> MemoryReading:
        try:
            vm = self._virtual_memory()
            total = int(vm.total)
            available = int(vm.available)
        except Exception as exc:  # psutil raises OSError, RuntimeError and more, by platform
            failed = f"psutil cannot read memory: {type(exc).__name__}: {exc}"
            return MemoryReading(readable=False, why=f"{why}; {failed}" if why else failed)
        if total <= 0:
            failed = f"psutil reports a total memory of {total} bytes"
            return MemoryReading(readable=False, why=f"{why}; {failed}" if why else failed)
        return _reading(available, total, PSUTIL_SOURCE, why)
