"""``machine``: the node's identity, for certificate fingerprints.

A certificate holds only while the hardware and the OS major version are those it was
earned under; this kind says what they are.  ``boot_id`` changes at every
boot where the OS has one, so a caller that stores it can notice a reboot.

- CPU model: Linux ``/proc/cpuinfo`` (``model name``; on ARM, where there is none,
  ``Hardware`` or ``Processor``, then the CPU implementer and part numbers), macOS ``sysctl
  -n machdep.cpu.brand_string``, elsewhere :func:`platform.processor`.
- OS: the lower-cased system name and the leading number of its release (``linux 6``,
  ``darwin 23``, ``windows 10``).
- boot id: Linux ``/proc/sys/kernel/random/boot_id``, macOS ``sysctl -n kern.bootsessionuuid``.

Everything but the hostname is fixed while the daemon runs (a change of any of it takes a
reboot, and the daemon with it), so it is read once and kept; the hostname is read every
time.
"""

from __future__ import annotations

import platform as _platform
import re
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from arbiter.plugin import HostSignal, KindOptions, PluginContext, run_child
from arbiter_host._files import read_text

SYSCTL = "/usr/sbin/sysctl"
TIMEOUT_S = 5.0
#: reads that try again what failed before the result is kept as it is
ATTEMPTS = 3
UNKNOWN = "unknown"

#: ``/proc/cpuinfo`` keys naming the CPU, best first (x86 and most others, then ARM)
_CPUINFO_KEYS = ("model name", "Hardware", "Processor", "cpu model", "cpu", "uarch")
_LEADING_NUMBER = re.compile(r"\d+")


@dataclass(frozen=True)
class MachineReading:
    """What this node is.

    ``cpu_model``: the CPU's name (``"AMD EPYC 7763 64-Core Processor"``, ``"Apple M2
    Pro"``, ``"BCM2835"``), spaces collapsed; ``"unknown"`` when nothing names it.

    ``os``: the OS name and major version, ``"linux 6"``, ``"darwin 23"``; just the name
    when the release has no leading number.

    ``arch``: the machine architecture as the OS reports it (``x86_64``, ``aarch64``,
    ``arm64``, ``AMD64``).

    ``hostname``: the node's network name as the OS reports it.

    ``boot_id``: an id that changes at every boot, where the OS has one; None otherwise.

    ``why``: what could not be read (empty when everything was).

    :attr:`identity` is what a certificate's fingerprint covers: everything but
    ``boot_id`` and ``why``.
    """

    cpu_model: str
    os: str
    arch: str
    hostname: str
    boot_id: str | None = None
    why: str = ""

    @property
    def identity(self) -> tuple[str, str, str, str]:
        """``(cpu_model, os, arch, hostname)``: equal for the same node, hardware and OS major version."""
        return (self.cpu_model, self.os, self.arch, self.hostname)


def _collapse(text: str) -> str:
    return " ".join(text.split())


def parse_cpuinfo(text: str) -> str | None:
    """The CPU's name in ``/proc/cpuinfo`` text, or None when it names none.

    Keys are matched exactly (``Processor`` on ARM names the CPU; ``processor`` on x86 is
    a core's index).  An ARM64 kernel often lists only ``CPU implementer`` and ``CPU
    part``: they make the name then (``"arm implementer 0x41 part 0xd0c"``).
    """
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key, value = key.strip(), _collapse(value)
        if sep and value and key not in fields:
            fields[key] = value
    for key in _CPUINFO_KEYS:
        if key in fields:
            return fields[key]
    implementer, part = fields.get("CPU implementer"), fields.get("CPU part")
    if implementer and part:
        return f"arm implementer {implementer} part {part}"
    return None


def os_version(system: str, release: str) -> str:
    """``"linux 6"`` from ``("Linux", "6.8.0-45-generic")``; the name alone without a leading number."""
    name = system.strip().lower() or UNKNOWN
    match = _LEADING_NUMBER.match(release.strip())
    return f"{name} {int(match.group())}" if match else name


def _run_sysctl(args: Sequence[str]) -> str:
    done: subprocess.CompletedProcess[str] = run_child(
        [SYSCTL, *args], capture_output=True, text=True, timeout=TIMEOUT_S, check=True, stdin=subprocess.DEVNULL
    )
    return done.stdout


@dataclass(frozen=True)
class _Fixed:
    cpu_model: str
    os: str
    arch: str
    boot_id: str | None
    why: tuple[str, ...]
    complete: bool  # False: a read failed, so it is tried again (up to ATTEMPTS reads in all)


class MachineOptions(KindOptions):
    kind: Literal["machine"] = "machine"


class MachineHostSignal(HostSignal):
    """Reads the node's identity; :meth:`read` returns a :class:`MachineReading`.

    ``uname`` (returns an object with ``system``, ``node``, ``release`` and ``machine``, as
    :func:`platform.uname` does), ``processor`` (as :func:`platform.processor`), ``proc_root``
    (the procfs mount) and ``run`` (runs ``sysctl`` with the given arguments, returns its
    output, raises ``OSError`` or ``subprocess.SubprocessError`` when it fails) are
    parameters so tests can fake a host; the daemon uses the defaults.
    """

    Options = MachineOptions

    def __init__(
        self,
        options: MachineOptions,
        context: PluginContext,
        *,
        uname: Callable[[], Any] = _platform.uname,
        processor: Callable[[], str] = _platform.processor,
        proc_root: str | Path = "/proc",
        run: Callable[[Sequence[str]], str] = _run_sysctl,
    ) -> None:
        super().__init__(options, context)
        self._uname = uname
        self._processor = processor
        self._proc = Path(proc_root)
        self._run = run
        self._lock = threading.Lock()  # the daemon may read from more than one worker thread
        self._fixed: _Fixed | None = None
        self._attempts = 0

    def read(self) -> MachineReading:
        uname = self._uname()
        with self._lock:
            if self._fixed is None or (not self._fixed.complete and self._attempts < ATTEMPTS):
                self._attempts += 1
                self._fixed = self._read_fixed(uname)
            fixed = self._fixed
        hostname = _collapse(str(uname.node or "")) or UNKNOWN
        why = fixed.why if hostname != UNKNOWN else (*fixed.why, "the OS reports no hostname")
        return MachineReading(
            cpu_model=fixed.cpu_model,
            os=fixed.os,
            arch=fixed.arch,
            hostname=hostname,
            boot_id=fixed.boot_id,
            why="; ".join(why),
        )

    def _read_fixed(self, uname: Any) -> _Fixed:
        system = str(uname.system or "")
        why: list[str] = []
        if system == "Linux":
            cpu_model, boot_id, failed = self._read_linux()
        elif system == "Darwin":
            cpu_model, boot_id, failed = self._read_darwin()
        else:
            cpu_model, boot_id, failed = None, None, []
        why += failed
        if cpu_model is None:
            try:
                cpu_model = _collapse(self._processor()) or None
            except Exception as exc:  # platform.processor may run a command that fails
                why.append(f"platform.processor() failed: {type(exc).__name__}: {exc}")
        if cpu_model is None:
            why.append("nothing names the CPU model")
        return _Fixed(
            cpu_model=cpu_model or UNKNOWN,
            os=os_version(system, str(uname.release or "")),
            arch=str(uname.machine or "").strip() or UNKNOWN,
            boot_id=boot_id,
            why=tuple(why),
            complete=not failed,
        )

    def _read_linux(self) -> tuple[str | None, str | None, list[str]]:
        failed = []
        cpuinfo_path = self._proc / "cpuinfo"
        cpuinfo = read_text(cpuinfo_path)
        if cpuinfo is None:
            failed.append(f"cannot read {cpuinfo_path}")
        boot_id_path = self._proc / "sys" / "kernel" / "random" / "boot_id"
        boot_id = read_text(boot_id_path) or None
        if boot_id is None:
            failed.append(f"cannot read {boot_id_path}")
        return (parse_cpuinfo(cpuinfo) if cpuinfo else None), boot_id, failed

    def _read_darwin(self) -> tuple[str | None, str | None, list[str]]:
        failed = []
        values: list[str | None] = []
        for name in ("machdep.cpu.brand_string", "kern.bootsessionuuid"):
            try:
                values.append(_collapse(self._run(["-n", name])) or None)
            except (OSError, subprocess.SubprocessError) as exc:
                failed.append(f"sysctl {name} failed: {exc}")
                values.append(None)
        return values[0], values[1], failed
