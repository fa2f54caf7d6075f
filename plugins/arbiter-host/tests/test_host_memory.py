"""The ``memory`` host signal: /proc/meminfo text, psutil fallbacks, and this host."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest
from pydantic import ValidationError

from arbiter.plugin import PluginContext
from arbiter_host.memory import MEMINFO_SOURCE, PSUTIL_SOURCE, MemoryHostSignal, MemoryReading, meminfo_value

GiB = 1024**3

MEMINFO = """\
MemTotal:       16384000 kB
MemFree:          512000 kB
MemAvailable:    1228800 kB
Buffers:          102400 kB
Cached:           716800 kB
SwapTotal:             0 kB
HugePages_Total:       4
Hugepagesize:       2048 kB
"""


def never() -> Any:
    raise AssertionError("psutil must not be asked when /proc/meminfo has MemAvailable")


def signal(tmp_path: Path, meminfo: str | None = MEMINFO, **kw: Any) -> MemoryHostSignal:
    proc = tmp_path / "proc"
    proc.mkdir(exist_ok=True)
    if meminfo is not None:
        (proc / "meminfo").write_text(meminfo)
    kw.setdefault("platform", "linux")
    kw.setdefault("virtual_memory", never)
    return MemoryHostSignal(MemoryHostSignal.Options(), PluginContext(state_dir=tmp_path), proc_root=proc, **kw)


def test_options_take_no_fields() -> None:
    MemoryHostSignal.Options.model_validate({})
    MemoryHostSignal.Options.model_validate({"kind": "memory"})
    with pytest.raises(ValidationError):
        MemoryHostSignal.Options.model_validate({"kind": "memory", "min_available": 0.1})


def test_meminfo_values_in_bytes() -> None:
    data = (MEMINFO + "garbage line\nOdd:  x kB\nEmpty:\nLast: 7 kB").encode()
    assert meminfo_value(data, "MemTotal") == 16384000 * 1024  # the first line
    assert meminfo_value(data, "MemAvailable") == 1228800 * 1024
    assert meminfo_value(data, "HugePages_Total") == 4  # a count, not kB
    assert meminfo_value(data, "Last") == 7 * 1024  # no newline after it
    assert meminfo_value(data, "Free") is None  # "MemFree" is not "Free"
    assert meminfo_value(data, "Odd") is meminfo_value(data, "Empty") is meminfo_value(data, "Missing") is None


def test_reads_mem_available_from_proc_meminfo(tmp_path: Path) -> None:
    reading = signal(tmp_path).read()
    assert reading == MemoryReading(
        readable=True,
        available_share=0.075,
        available_bytes=1228800 * 1024,
        total_bytes=16384000 * 1024,
        source=MEMINFO_SOURCE,
    )
    # below the node config's default memory guard (0.10): the core trips, the plugin only reports
    assert reading.available_share is not None and reading.available_share < 0.10


def test_reading_is_frozen(tmp_path: Path) -> None:
    reading = signal(tmp_path).read()
    with pytest.raises(dataclasses.FrozenInstanceError):
        reading.available_share = 1.0  # type: ignore[misc]


def test_old_kernel_without_mem_available_falls_back_to_psutil(tmp_path: Path) -> None:
    old = "".join(line + "\n" for line in MEMINFO.splitlines() if not line.startswith("MemAvailable"))
    vm = SimpleNamespace(total=8 * GiB, available=2 * GiB)
    reading = signal(tmp_path, old, virtual_memory=lambda: vm).read()
    assert reading.readable and reading.source == PSUTIL_SOURCE
    assert reading.available_share == 0.25
    assert (reading.available_bytes, reading.total_bytes) == (2 * GiB, 8 * GiB)
    assert "MemAvailable" in reading.why and "3.14" in reading.why


def test_unreadable_meminfo_falls_back_to_psutil(tmp_path: Path) -> None:
    vm = SimpleNamespace(total=4 * GiB, available=3 * GiB)
    reading = signal(tmp_path, None, virtual_memory=lambda: vm).read()
    assert reading.readable and reading.source == PSUTIL_SOURCE and reading.available_share == 0.75
    assert "cannot read" in reading.why


def test_nothing_readable_is_a_reading_not_an_exception(tmp_path: Path) -> None:
    def broken() -> Any:
        raise OSError("no /proc here")

    reading = signal(tmp_path, "MemFree: 1 kB\n", virtual_memory=broken).read()
    assert reading == MemoryReading(readable=False, why=reading.why)
    assert "MemTotal" in reading.why and "no /proc here" in reading.why
    assert reading.available_share is None


def test_other_oses_use_psutil(tmp_path: Path) -> None:
    vm = SimpleNamespace(total=32 * GiB, available=8 * GiB)
    reading = signal(tmp_path, platform="darwin", virtual_memory=lambda: vm).read()
    assert reading == MemoryReading(True, 0.25, 8 * GiB, 32 * GiB, PSUTIL_SOURCE)


def test_available_is_clamped_to_the_total(tmp_path: Path) -> None:
    reading = signal(tmp_path, "MemTotal: 100 kB\nMemAvailable: 150 kB\n").read()
    assert reading.available_share == 1.0 and reading.available_bytes == reading.total_bytes == 102400


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/meminfo is Linux's")
def test_this_host_agrees_with_psutil(tmp_path: Path) -> None:
    sig = MemoryHostSignal(MemoryHostSignal.Options(), PluginContext(state_dir=tmp_path))
    reading = sig.read()
    vm = psutil.virtual_memory()
    print(f"this host: {reading}")
    assert reading.readable and reading.source == MEMINFO_SOURCE and reading.why == ""
    assert reading.available_share is not None and 0 < reading.available_share <= 1
    assert reading.total_bytes == vm.total
    assert reading.available_bytes is not None
    assert abs(reading.available_bytes - vm.available) < 0.05 * vm.total  # memory moves between reads


def test_psutil_path_on_this_host(tmp_path: Path) -> None:
    sig = MemoryHostSignal(MemoryHostSignal.Options(), PluginContext(state_dir=tmp_path), platform="other")
    reading = sig.read()
    assert reading.readable and reading.source == PSUTIL_SOURCE
    assert reading.available_share is not None and 0 < reading.available_share <= 1
