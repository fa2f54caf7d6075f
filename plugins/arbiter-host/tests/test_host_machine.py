"""The ``machine`` host signal: cpuinfo of several architectures, macOS sysctl, and this host."""

from __future__ import annotations

import dataclasses
import platform
import re
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from arbiter.plugin import PluginContext
from arbiter_host.machine import MachineHostSignal, MachineReading, os_version, parse_cpuinfo

BOOT_ID = "0b7a1f5e-3c2d-4e8f-9a6b-1c2d3e4f5a6b"

X86_CPUINFO = """\
processor	: 0
vendor_id	: GenuineIntel
cpu family	: 6
model		: 85
model name	: Intel(R) Xeon(R) Gold 6230   CPU @ 2.10GHz
cpu MHz		: 2100.000

processor	: 1
vendor_id	: GenuineIntel
model name	: Intel(R) Xeon(R) Gold 6230   CPU @ 2.10GHz
"""

# a 32-bit ARM board: the SoC in "Hardware", the core in "Processor", "processor" an index
ARM_CPUINFO = """\
Processor	: ARMv7 Processor rev 10 (v7l)
processor	: 0
BogoMIPS	: 790.52

processor	: 1
BogoMIPS	: 790.52

Features	: swp half thumb fastmult vfp edsp neon vfpv3 tls
CPU implementer	: 0x41
CPU architecture: 7
CPU variant	: 0x2
CPU part	: 0xc09
CPU revision	: 10

Hardware	: Freescale i.MX 6Quad/DualLite (Device Tree)
Revision	: 0000
Serial		: 0000000000000000
"""

# an older ARM kernel with only "Processor"
ARM_PROCESSOR_ONLY = "Processor\t: ARMv6-compatible processor rev 7 (v6l)\nprocessor\t: 0\nBogoMIPS\t: 697.95\n"

# a 64-bit ARM server: no name at all, only the implementer and part numbers
ARM64_CPUINFO = """\
processor	: 0
BogoMIPS	: 243.75
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics
CPU implementer	: 0x41
CPU architecture: 8
CPU variant	: 0x3
CPU part	: 0xd0c
CPU revision	: 1
"""


def uname(
    system: str = "Linux", node: str = "node1", release: str = "6.8.0-45-generic", machine: str = "x86_64"
) -> Any:
    return lambda: SimpleNamespace(system=system, node=node, release=release, version="#1", machine=machine)


def no_processor() -> str:
    raise AssertionError("platform.processor() must not be asked when the OS names the CPU")


def no_sysctl(args: Sequence[str]) -> str:
    raise AssertionError("sysctl is macOS's")


def fake_proc(tmp_path: Path, cpuinfo: str | None, boot_id: str | None = BOOT_ID) -> Path:
    proc = tmp_path / "proc"
    (proc / "sys" / "kernel" / "random").mkdir(parents=True)
    if cpuinfo is not None:
        (proc / "cpuinfo").write_text(cpuinfo)
    if boot_id is not None:
        (proc / "sys" / "kernel" / "random" / "boot_id").write_text(boot_id + "\n")
    return proc


def signal(tmp_path: Path, **kw: Any) -> MachineHostSignal:
    kw.setdefault("uname", uname())
    kw.setdefault("processor", no_processor)
    kw.setdefault("run", no_sysctl)
    return MachineHostSignal(MachineHostSignal.Options(), PluginContext(state_dir=tmp_path), **kw)


def test_options_take_no_fields() -> None:
    MachineHostSignal.Options.model_validate({"kind": "machine"})
    with pytest.raises(ValidationError):
        MachineHostSignal.Options.model_validate({"kind": "machine", "hostname": "x"})


@pytest.mark.parametrize(
    ("text", "model"),
    [
        (X86_CPUINFO, "Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz"),
        (ARM_CPUINFO, "Freescale i.MX 6Quad/DualLite (Device Tree)"),
        (ARM_PROCESSOR_ONLY, "ARMv6-compatible processor rev 7 (v6l)"),
        (ARM64_CPUINFO, "arm implementer 0x41 part 0xd0c"),
        ("processor\t: 0\ncpu\t\t: POWER9 (raw), altivec supported\n", "POWER9 (raw), altivec supported"),
        ("processor\t: 0\nBogoMIPS\t: 1.0\n", None),
        ("", None),
    ],
)
def test_parse_cpuinfo(text: str, model: str | None) -> None:
    assert parse_cpuinfo(text) == model


@pytest.mark.parametrize(
    ("system", "release", "expected"),
    [
        ("Linux", "6.8.0-45-generic", "linux 6"),
        ("Linux", "5.15.153.1-microsoft-standard-WSL2", "linux 5"),
        ("Darwin", "23.4.0", "darwin 23"),
        ("Windows", "10", "windows 10"),
        ("FreeBSD", "14.0-RELEASE", "freebsd 14"),
        ("Linux", "", "linux"),
        ("", "", "unknown"),
    ],
)
def test_os_version(system: str, release: str, expected: str) -> None:
    assert os_version(system, release) == expected


def test_linux_arm_board(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, ARM_CPUINFO)
    reading = signal(tmp_path, proc_root=proc, uname=uname(node="pi", release="5.10.17-v7+", machine="armv7l")).read()
    assert reading == MachineReading(
        cpu_model="Freescale i.MX 6Quad/DualLite (Device Tree)",
        os="linux 5",
        arch="armv7l",
        hostname="pi",
        boot_id=BOOT_ID,
    )
    assert reading.identity == ("Freescale i.MX 6Quad/DualLite (Device Tree)", "linux 5", "armv7l", "pi")
    with pytest.raises(dataclasses.FrozenInstanceError):
        reading.hostname = "other"  # type: ignore[misc]


def test_linux_x86(tmp_path: Path) -> None:
    reading = signal(tmp_path, proc_root=fake_proc(tmp_path, X86_CPUINFO)).read()
    assert reading == MachineReading("Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz", "linux 6", "x86_64", "node1", BOOT_ID)


def test_linux_without_a_name_in_cpuinfo_asks_platform_processor(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, "processor\t: 0\n")
    reading = signal(tmp_path, proc_root=proc, processor=lambda: "x86_64").read()
    assert reading.cpu_model == "x86_64" and reading.why == ""


def test_nothing_readable_is_a_reading_not_an_exception(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, None, boot_id=None)
    reading = signal(tmp_path, proc_root=proc, processor=lambda: "", uname=uname(node="", machine="")).read()
    assert (reading.cpu_model, reading.os, reading.arch, reading.hostname, reading.boot_id) == (
        "unknown",
        "linux 6",
        "unknown",
        "unknown",
        None,
    )
    for part in ("cpuinfo", "boot_id", "nothing names the CPU model", "no hostname"):
        assert part in reading.why


def test_fixed_parts_are_read_once_and_the_hostname_every_time(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, X86_CPUINFO)
    names = iter(["before", "after"])
    sig = signal(
        tmp_path,
        proc_root=proc,
        uname=lambda: SimpleNamespace(system="Linux", node=next(names), release="6.1", machine="x86_64"),
    )
    first = sig.read()
    (proc / "cpuinfo").write_text(ARM_CPUINFO)  # cannot happen without a reboot: not read again
    second = sig.read()
    assert first.cpu_model == second.cpu_model == "Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz"
    assert (first.hostname, second.hostname) == ("before", "after")


def test_a_failed_read_is_tried_again_a_few_times(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, None)
    calls: list[int] = []

    def processor() -> str:
        calls.append(1)
        return ""

    sig = signal(tmp_path, proc_root=proc, processor=processor)
    assert sig.read().cpu_model == "unknown"
    (proc / "cpuinfo").write_text(X86_CPUINFO)
    reading = sig.read()
    assert reading.cpu_model.startswith("Intel(R) Xeon(R)") and reading.why == ""
    assert len(calls) == 1

    stuck = signal(tmp_path, proc_root=fake_proc(tmp_path / "stuck", None), processor=processor)
    for _ in range(10):
        assert stuck.read().cpu_model == "unknown"
    assert len(calls) == 1 + 3  # given up after three reads


def test_macos_asks_sysctl(tmp_path: Path) -> None:
    asked: list[tuple[str, ...]] = []
    answers = {
        "machdep.cpu.brand_string": "Apple M2 Pro\n",
        "kern.bootsessionuuid": "9F3C2E1A-0000-4B5C-8D7E-112233445566\n",
    }

    def run(args: Sequence[str]) -> str:
        asked.append(tuple(args))
        return answers[args[-1]]

    sig = signal(
        tmp_path, run=run, uname=uname("Darwin", "Studio.local", "23.4.0", "arm64"), proc_root=tmp_path / "none"
    )
    reading = sig.read()
    assert reading == MachineReading(
        "Apple M2 Pro", "darwin 23", "arm64", "Studio.local", "9F3C2E1A-0000-4B5C-8D7E-112233445566"
    )
    sig.read()
    assert asked == [("-n", "machdep.cpu.brand_string"), ("-n", "kern.bootsessionuuid")]  # once


def test_macos_sysctl_failing_falls_back_to_platform_processor(tmp_path: Path) -> None:
    def run(args: Sequence[str]) -> str:
        raise subprocess.TimeoutExpired(["sysctl", *args], 5)

    sig = signal(tmp_path, run=run, processor=lambda: "arm", uname=uname("Darwin", "mac", "22.1.0", "arm64"))
    reading = sig.read()
    assert (reading.cpu_model, reading.os, reading.boot_id) == ("arm", "darwin 22", None)
    assert "machdep.cpu.brand_string" in reading.why and "kern.bootsessionuuid" in reading.why


def test_windows_uses_platform_processor_and_has_no_boot_id(tmp_path: Path) -> None:
    sig = signal(
        tmp_path,
        uname=uname("Windows", "DESKTOP-1", "10", "AMD64"),
        processor=lambda: "Intel64 Family 6 Model 158 Stepping 10, GenuineIntel",
    )
    assert sig.read() == MachineReading(
        "Intel64 Family 6 Model 158 Stepping 10, GenuineIntel", "windows 10", "AMD64", "DESKTOP-1", None
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_this_host(tmp_path: Path) -> None:
    reading = MachineHostSignal(MachineHostSignal.Options(), PluginContext(state_dir=tmp_path)).read()
    print(f"this host: {reading}")
    assert reading.why == ""
    assert reading.cpu_model == parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    assert reading.os == f"linux {platform.release().split('.')[0]}"
    assert reading.arch == platform.machine()
    assert reading.hostname == socket.gethostname()
    assert reading.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert reading.boot_id is not None and re.fullmatch(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", reading.boot_id)
