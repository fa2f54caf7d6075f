"""``power``: whether the host runs on mains (``ac``) or on its battery.

The A/B harness leaves out a block during which the power source changed:
a laptop that leaves its charger slows down for reasons that have nothing to do with the
fleet.  This kind only reports; the harness compares ``source`` between readings.

On Linux the reading comes from ``/sys/class/power_supply``: each supply's ``type``
(``Mains``, ``USB``, ``Battery``, ``UPS``, ...), an adapter's ``online`` and a battery's
``status`` and charge.  Batteries of peripherals (``scope`` = ``Device``: a wireless
mouse, a phone) and empty battery bays (``present`` = 0) are not the host's and are
skipped.  Elsewhere psutil's :func:`~psutil.sensors_battery` is the reading.

A host with no battery of its own (a desktop, a server, most VMs) reads as ``ac``: it can
only run on mains.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psutil

from arbiter.plugin import HostSignal, KindOptions, PluginContext
from arbiter_host._files import read_int, read_text

PowerSource = Literal["ac", "battery", "unknown"]

#: a battery status that says external power is there (charging, or held at a threshold)
_ON_MAINS_STATUS = frozenset({"Charging", "Full", "Not charging"})
#: psutil's battery reader, None on an OS where psutil has none
_SENSORS_BATTERY: Callable[[], Any] | None = getattr(psutil, "sensors_battery", None)


@dataclass(frozen=True)
class PowerReading:
    """The host's power source at one moment.

    ``source``: ``"ac"`` (mains, or no battery of its own), ``"battery"`` (running on its
    battery, or on a UPS that lost mains) or ``"unknown"``.

    ``battery_percent``: the charge of the host's batteries together, 0 to 100, where
    known; None on a host without a battery or when it cannot be read.

    ``why``: what the reading rests on (``"AC online"``, ``"BAT0 discharging"``, ``"no
    battery"``); for ``unknown``, why it is not known.
    """

    source: PowerSource
    battery_percent: float | None = None
    why: str = ""


@dataclass(frozen=True)
class _Battery:
    name: str
    status: str
    capacity: int | None
    energy: tuple[int, int] | None  # (now, full), µWh
    charge: tuple[int, int] | None  # (now, full), µAh


def _pair(folder: Path, now: str, full: str) -> tuple[int, int] | None:
    a, b = read_int(folder / now), read_int(folder / full)
    return (a, b) if a is not None and b is not None and b > 0 else None


def _percent(batteries: list[_Battery]) -> float | None:
    """The charge of all the batteries together.

    Energy (µWh) adds up across batteries of different sizes; charge (µAh) does when their
    voltages match, which is the case for the two packs of one laptop.  Otherwise it is the
    mean of each battery's own ``capacity``.
    """
    if not batteries:
        return None
    for pairs in ([b.energy for b in batteries], [b.charge for b in batteries]):
        if all(p is not None for p in pairs):
            now = sum(p[0] for p in pairs if p is not None)
            full = sum(p[1] for p in pairs if p is not None)
            return round(max(0.0, min(100.0, 100.0 * now / full)), 1)
    capacities = [b.capacity for b in batteries if b.capacity is not None]
    if not capacities:
        return None
    return round(max(0.0, min(100.0, sum(capacities) / len(capacities))), 1)


def read_power_supply(folder: Path) -> PowerReading:
    """The power source from a ``/sys/class/power_supply`` tree (pure but for file reads)."""
    try:
        names = sorted(entry.name for entry in folder.iterdir())
    except OSError as exc:
        return PowerReading("unknown", why=f"cannot list {folder}: {exc.strerror or exc}")
    batteries: list[_Battery] = []
    adapters: dict[str, bool | None] = {}  # name -> online
    ups_offline: list[str] = []
    for name in names:
        supply = folder / name
        if read_text(supply / "scope") == "Device":
            continue  # a peripheral's battery or charger, not the host's
        kind = read_text(supply / "type")
        if kind == "Battery":
            if read_text(supply / "present") == "0":
                continue  # an empty bay
            batteries.append(
                _Battery(
                    name=name,
                    status=read_text(supply / "status") or "Unknown",
                    capacity=read_int(supply / "capacity"),
                    energy=_pair(supply, "energy_now", "energy_full"),
                    charge=_pair(supply, "charge_now", "charge_full"),
                )
            )
            continue
        if kind is None:
            continue  # gone between listing and reading, or not a supply
        online = read_int(supply / "online")
        if kind == "UPS":
            if online == 0 or read_text(supply / "status") == "Discharging":
                ups_offline.append(name)
            continue
        adapters[name] = None if online is None else online > 0

    percent = _percent(batteries)
    on_ac = [name for name, up in adapters.items() if up]
    if on_ac:
        return PowerReading("ac", percent, f"{', '.join(on_ac)} online")
    discharging = [b.name for b in batteries if b.status == "Discharging"]
    if discharging:
        return PowerReading("battery", percent, f"{', '.join(discharging)} discharging")
    if ups_offline:
        return PowerReading("battery", percent, f"UPS {', '.join(ups_offline)} on battery")
    if batteries:
        if adapters and all(up is False for up in adapters.values()):
            return PowerReading("battery", percent, f"{', '.join(adapters)} offline")
        on_mains = [b.name for b in batteries if b.status in _ON_MAINS_STATUS]
        if on_mains:
            status = ", ".join(f"{b.name} {b.status.lower()}" for b in batteries if b.status in _ON_MAINS_STATUS)
            return PowerReading("ac", percent, status)
        states = ", ".join(f"{b.name} {b.status.lower()}" for b in batteries)
        if adapters:
            return PowerReading("unknown", percent, f"{states}; no adapter reports whether it is online")
        return PowerReading("unknown", percent, f"{states}, and no adapter is listed")
    return PowerReading("ac", None, "no battery")


class PowerOptions(KindOptions):
    kind: Literal["power"] = "power"


class PowerHostSignal(HostSignal):
    """Reads the host's power source; :meth:`read` returns a :class:`PowerReading`.

    ``platform``, ``sys_root`` (the sysfs mount, holding ``class/power_supply``) and
    ``sensors_battery`` (what psutil's :func:`~psutil.sensors_battery` would return; None
    where psutil has no such function) are parameters so tests can fake a host; the daemon
    uses the defaults.
    """

    Options = PowerOptions

    def __init__(
        self,
        options: PowerOptions,
        context: PluginContext,
        *,
        platform: str = sys.platform,
        sys_root: str | Path = "/sys",
        sensors_battery: Callable[[], Any] | None = _SENSORS_BATTERY,
    ) -> None:
        super().__init__(options, context)
        self._linux = platform.startswith("linux")
        self._folder = Path(sys_root) / "class" / "power_supply"
        self._sensors_battery = sensors_battery

    def read(self) -> PowerReading:
        if self._linux:
            return read_power_supply(self._folder)
        return self._read_psutil()

    def _read_psutil(self) -> PowerReading:
        if self._sensors_battery is None:
            return PowerReading("unknown", why="psutil cannot read the battery on this OS")
        try:
            battery = self._sensors_battery()
        except Exception as exc:  # psutil raises OSError, RuntimeError and more, by platform
            return PowerReading("unknown", why=f"psutil cannot read the battery: {type(exc).__name__}: {exc}")
        if battery is None:
            return PowerReading("ac", why="no battery")
        percent = getattr(battery, "percent", None)
        percent = None if percent is None else round(max(0.0, min(100.0, float(percent))), 1)
        plugged = getattr(battery, "power_plugged", None)
        if plugged is None:
            return PowerReading("unknown", percent, "the battery does not say whether power is plugged in")
        if plugged:
            return PowerReading("ac", percent, "power plugged in")
        return PowerReading("battery", percent, "on battery")
