"""arbiter host signal kinds: what the host itself is doing, as values.

- ``memory``: available host memory as a share of the total (for the memory guard,
  ``memory_guard.min_available``), from ``/proc/meminfo`` on Linux, psutil elsewhere;
- ``power``: the power source (``ac``, ``battery`` or ``unknown``) and the battery's
  charge (for the A/B harness's exclusions), from ``/sys/class/power_supply`` on Linux,
  psutil elsewhere;
- ``machine``: the node's identity for certificate fingerprints (CPU model, OS and major
  version, architecture, hostname) and a boot id that changes at every boot;
- ``access``: whether this account may open the GPU's device files and read other users'
  processes (for ``arbiter doctor``), with a fix for each problem.

It answers ``arbiter_listeners`` (who owns the socket listening on a port:
:mod:`arbiter_host.listeners`), and implements ``arbiter_fast_thread``: on Linux 6.12 and later each fast-path thread
asks the scheduler for a 0.1 ms slice, so that it gets a core sooner when it wakes
(:mod:`arbiter_host.fastthread`).

Each kind's ``read()`` returns a small frozen dataclass (:class:`MemoryReading`,
:class:`PowerReading`, :class:`MachineReading`) and never raises for a condition a host
can be in: what cannot be read is said in the reading.

Registered through the ``arbiter`` entry point group; imports only :mod:`arbiter.plugin`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from arbiter.plugin import hookimpl
from arbiter_host.access import AccessHostSignal, AccessReading
from arbiter_host.fastthread import ask_short_slice
from arbiter_host.listeners import listeners
from arbiter_host.machine import MachineHostSignal, MachineReading
from arbiter_host.memory import MemoryHostSignal, MemoryReading
from arbiter_host.power import PowerHostSignal, PowerReading

__all__ = [
    "AccessHostSignal",
    "AccessReading",
    "MachineHostSignal",
    "MachineReading",
    "MemoryHostSignal",
    "MemoryReading",
    "PowerHostSignal",
    "PowerReading",
    "arbiter_fast_thread",
    "arbiter_listeners",
    "arbiter_register_host",
]


@hookimpl
def arbiter_register_host(register: Callable[[str, type], None]) -> None:
    register("memory", MemoryHostSignal)
    register("power", PowerHostSignal)
    register("machine", MachineHostSignal)
    register("access", AccessHostSignal)


@hookimpl
def arbiter_fast_thread(role: str) -> str | None:
    return ask_short_slice()


@hookimpl
def arbiter_listeners(address: str, port: int) -> list[dict[str, Any]] | None:
    return listeners(address, port)
