"""The ``macos_ioreg`` reader: parsing ioreg output, and reads driven by a stand-in ioreg."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from pydantic import ValidationError

from arbiter.plugin import PluginContext
from arbiter_readers.macos_ioreg import (
    NO_CLIENT_WHY,
    NOT_MACOS_WHY,
    AgxClient,
    MacosIoregReader,
    accelerator_memory,
    gpu_time_by_pid,
    parse_performance_statistics,
    parse_user_clients,
)

FIXTURES = Path(__file__).parent / "fixtures" / "macos-ioreg"
CLIENTS = (FIXTURES / "ioreg-AGXDeviceUserClient-constructed.txt").read_text()
ACCELERATOR = (FIXTURES / "ioreg-IOAccelerator-AGXAcceleratorG13X-M1Pro-trimmed.txt").read_text()
WINDOWSERVER_NS = 51234567890 + 765432100 + 2000000000


def test_options_take_no_fields() -> None:
    MacosIoregReader.Options.model_validate({})
    with pytest.raises(ValidationError):
        MacosIoregReader.Options.model_validate({"kind": "macos_ioreg", "command": "ioreg"})


def test_user_clients_parsed_whole() -> None:
    clients = parse_user_clients(CLIENTS)
    assert clients == [
        AgxClient("0x1000009a1", 412, "loginwindow", 0),  # AppUsage = (): holds the GPU, no time yet
        AgxClient("0x1000009b7", 398, "WindowServer", 51234567890 + 765432100),  # two AppUsage records
        AgxClient("0x1000009c2", 398, "WindowServer", 2000000000),
        AgxClient("0x100001f3e", 4245, "python3.12", 123632000000),
    ]
    assert gpu_time_by_pid(clients) == {412: 0, 398: WINDOWSERVER_NS, 4245: 123632000000}


def test_tree_prefixes_direct_keys_and_entries_without_a_creator() -> None:
    text = """\
+-o AGXAcceleratorG13X  <class AGXAcceleratorG13X, id 0x10000087c, registered, matched, active, busy 0, retain 24>
  | {
  |   "PerformanceStatistics" = {"Device Utilization %"=2}
  | }
  |
  +-o AGXDeviceUserClient  <class AGXDeviceUserClient, id 0x100000a00, !registered, !matched, active, busy 0, retain 6>
  |   {
  |     "accumulatedGPUTime" = 1500
  |     "IOUserClientCreator" = "pid 77, Some App"
  |   }
  |
  +-o IOAccelerationUserClient  <class IOAccelerationUserClient, id 0x100000a01>
      {
        "AppUsage" = ({"API"="Metal","accumulatedGPUTime"=999})
      }
"""
    assert parse_user_clients(text) == [AgxClient("0x100000a00", 77, "Some App", 1500)]


def test_accelerator_memory_from_the_m1_pro_capture() -> None:
    stats = parse_performance_statistics(ACCELERATOR)
    assert len(stats) == 1
    assert stats[0]["Alloc system memory"] == 1214005248
    assert stats[0]["In use system memory"] == 340983808
    assert stats[0]["Device Utilization %"] == 2
    assert accelerator_memory(stats) == (1214005248, 1214005248 - 340983808)
    assert accelerator_memory([{"Device Utilization %": 5}]) == (None, None)
    assert parse_performance_statistics(CLIENTS) == []


class FakeIoreg:
    """Answers ``ioreg ... -c CLASS`` with the text the test sets for CLASS."""

    def __init__(self, outputs: dict[str, str | BaseException]) -> None:
        self.outputs = outputs
        self.calls: list[list[str]] = []

    def __call__(self, args: Sequence[str]) -> str:
        self.calls.append(list(args))
        answer = self.outputs[args[-1]]
        if isinstance(answer, BaseException):
            raise answer
        return answer


def reader(ioreg: FakeIoreg, platform: str = "darwin") -> MacosIoregReader:
    options = MacosIoregReader.Options.model_validate({"kind": "macos_ioreg"})
    return MacosIoregReader(options, PluginContext(state_dir=Path(".")), platform=platform, run=ioreg)


def test_reads_gpu_time_per_asked_process_and_accelerator_memory() -> None:
    ioreg = FakeIoreg({"AGXDeviceUserClient": CLIENTS, "IOAccelerator": ACCELERATOR})
    reading = reader(ioreg).read([398, 412, 999])
    assert ioreg.calls[0] == ["-r", "-d", "1", "-w", "0", "-c", "AGXDeviceUserClient"]
    assert ioreg.calls[1] == ["-r", "-d", "1", "-w", "0", "-c", "IOAccelerator"]
    assert reading.readable and reading.device == "gpu" and reading.unreadable == frozenset()
    assert reading.processes[398].busy_ns == {"gpu": WINDOWSERVER_NS}
    assert reading.processes[412].busy_ns == {"gpu": 0}
    assert reading.processes[398].vram_bytes is None  # unified memory: no per-process VRAM figure
    assert 999 not in reading.processes and 4245 not in reading.processes
    assert reading.vram_total_bytes == 1214005248 and reading.vram_free_bytes == 1214005248 - 340983808


def test_a_closed_client_keeps_what_it_counted() -> None:
    ioreg = FakeIoreg({"AGXDeviceUserClient": CLIENTS, "IOAccelerator": ACCELERATOR})
    r = reader(ioreg)
    assert r.read([398]).processes[398].busy_ns["gpu"] == WINDOWSERVER_NS
    # the client 0x1000009c2 closes, and the other one works 1 s more
    start = CLIENTS.index("+-o AGXDeviceUserClient  <class AGXDeviceUserClient, id 0x1000009c2")
    end = CLIENTS.index("+-o AGXDeviceUserClient  <class AGXDeviceUserClient, id 0x100001f3e")
    later = (CLIENTS[:start] + CLIENTS[end:]).replace("51234567890", "52234567890")
    ioreg.outputs["AGXDeviceUserClient"] = later
    assert r.read([398]).processes[398].busy_ns["gpu"] == WINDOWSERVER_NS + 1_000_000_000


def test_accelerator_memory_is_optional() -> None:
    ioreg = FakeIoreg({"AGXDeviceUserClient": CLIENTS, "IOAccelerator": subprocess.TimeoutExpired("ioreg", 5)})
    reading = reader(ioreg).read([4245])
    assert reading.readable and reading.processes[4245].busy_ns == {"gpu": 123632000000}
    assert reading.vram_total_bytes is None and reading.vram_free_bytes is None


@pytest.mark.parametrize(
    "failure",
    [
        FileNotFoundError(2, "No such file or directory"),
        subprocess.TimeoutExpired("ioreg", 5),
        subprocess.CalledProcessError(1, "ioreg"),
    ],
)
def test_ioreg_that_fails_is_not_readable(failure: BaseException) -> None:
    reading = reader(FakeIoreg({"AGXDeviceUserClient": failure})).read([1])
    assert not reading.readable and reading.why.startswith("ioreg cannot list AGXDeviceUserClient: ")


def test_no_gpu_client_at_all_is_not_readable() -> None:
    reading = reader(FakeIoreg({"AGXDeviceUserClient": "", "IOAccelerator": ACCELERATOR})).read([1])
    assert not reading.readable and reading.why == NO_CLIENT_WHY


def test_elsewhere_it_is_not_macos() -> None:
    ioreg = FakeIoreg({})
    reading = reader(ioreg, platform="linux").read([1])
    assert not reading.readable and reading.why == NOT_MACOS_WHY == "not macOS" and ioreg.calls == []


@pytest.mark.skipif(sys.platform == "darwin", reason="checks a host that is not macOS")
def test_this_host_is_not_macos() -> None:
    options = MacosIoregReader.Options.model_validate({"kind": "macos_ioreg"})
    reading = MacosIoregReader(options, PluginContext(state_dir=Path("."))).read([1])
    assert not reading.readable and reading.why == "not macOS"
