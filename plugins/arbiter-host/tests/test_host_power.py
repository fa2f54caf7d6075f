"""The ``power`` host signal: faked power_supply trees, psutil's battery, and this host."""

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
from arbiter_host.power import PowerHostSignal, PowerReading


def supply(root: Path, name: str, **attrs: object) -> None:
    folder = root / "class" / "power_supply" / name
    folder.mkdir(parents=True)
    for key, value in attrs.items():
        (folder / key).write_text(f"{value}\n")


def ac(root: Path, online: int, name: str = "AC") -> None:
    supply(root, name, type="Mains", online=online)


def battery(root: Path, status: str, capacity: int = 57, name: str = "BAT0", **attrs: object) -> None:
    supply(root, name, type="Battery", status=status, capacity=capacity, present=1, scope="System", **attrs)


def signal(root: Path, **kw: Any) -> PowerHostSignal:
    kw.setdefault("platform", "linux")
    return PowerHostSignal(PowerHostSignal.Options(), PluginContext(state_dir=root), sys_root=root, **kw)


def test_options_take_no_fields() -> None:
    PowerHostSignal.Options.model_validate({"kind": "power"})
    with pytest.raises(ValidationError):
        PowerHostSignal.Options.model_validate({"kind": "power", "path": "/sys"})


def test_ac_offline_with_a_battery_reads_battery(tmp_path: Path) -> None:
    ac(tmp_path, 0)
    battery(tmp_path, "Discharging", 57)
    reading = signal(tmp_path).read()
    assert reading == PowerReading("battery", 57.0, "BAT0 discharging")
    with pytest.raises(dataclasses.FrozenInstanceError):
        reading.source = "ac"  # type: ignore[misc]


def test_ac_offline_reads_battery_even_when_the_battery_status_is_unknown(tmp_path: Path) -> None:
    ac(tmp_path, 0)
    battery(tmp_path, "Unknown", 80)
    assert signal(tmp_path).read() == PowerReading("battery", 80.0, "AC offline")


def test_ac_online_reads_ac_with_the_battery_percent(tmp_path: Path) -> None:
    ac(tmp_path, 1)
    battery(tmp_path, "Charging", 42)
    assert signal(tmp_path).read() == PowerReading("ac", 42.0, "AC online")


def test_usb_c_charger_online_reads_ac(tmp_path: Path) -> None:
    ac(tmp_path, 0, name="ACAD")
    supply(tmp_path, "ucsi-source-psy-USBC000:001", type="USB", online=1, scope="System")
    battery(tmp_path, "Charging")
    reading = signal(tmp_path).read()
    assert reading.source == "ac" and reading.why == "ucsi-source-psy-USBC000:001 online"


def test_desktop_without_a_battery_reads_ac(tmp_path: Path) -> None:
    (tmp_path / "class" / "power_supply").mkdir(parents=True)
    assert signal(tmp_path).read() == PowerReading("ac", None, "no battery")


def test_desktop_with_offline_usb_ports_and_no_battery_reads_ac(tmp_path: Path) -> None:
    supply(tmp_path, "ucsi-source-psy-USBC000:001", type="USB", online=0)
    assert signal(tmp_path).read() == PowerReading("ac", None, "no battery")


def test_peripheral_batteries_and_empty_bays_are_not_the_hosts(tmp_path: Path) -> None:
    supply(tmp_path, "hidpp_battery_0", type="Battery", scope="Device", status="Discharging", capacity=20)
    supply(tmp_path, "BAT1", type="Battery", present=0, status="Unknown")
    assert signal(tmp_path).read() == PowerReading("ac", None, "no battery")


def test_battery_status_decides_without_an_adapter(tmp_path: Path) -> None:
    battery(tmp_path, "Not charging", 80)  # held at a charge threshold: on mains
    assert signal(tmp_path).read() == PowerReading("ac", 80.0, "BAT0 not charging")


def test_battery_status_unknown_and_no_adapter_reads_unknown_with_why(tmp_path: Path) -> None:
    battery(tmp_path, "Unknown", 66)
    reading = signal(tmp_path).read()
    assert reading.source == "unknown" and reading.battery_percent == 66.0
    assert reading.why == "BAT0 unknown, and no adapter is listed"


def test_adapter_without_online_and_an_unknown_battery_reads_unknown(tmp_path: Path) -> None:
    supply(tmp_path, "AC", type="Mains")  # online unreadable
    battery(tmp_path, "Unknown")
    reading = signal(tmp_path).read()
    assert reading.source == "unknown" and "no adapter reports whether it is online" in reading.why


def test_two_batteries_combine_by_energy(tmp_path: Path) -> None:
    ac(tmp_path, 0)
    battery(tmp_path, "Discharging", 90, name="BAT0", energy_now=18_000_000, energy_full=20_000_000)
    battery(tmp_path, "Not charging", 10, name="BAT1", energy_now=6_000_000, energy_full=60_000_000)
    reading = signal(tmp_path).read()
    assert reading == PowerReading("battery", 30.0, "BAT0 discharging")  # 24 of 80 Wh, not the mean of 90 and 10


def test_battery_percent_from_charge_when_there_is_no_capacity_file(tmp_path: Path) -> None:
    supply(tmp_path, "BAT0", type="Battery", status="Discharging", charge_now=2500, charge_full=5000)
    assert signal(tmp_path).read() == PowerReading("battery", 50.0, "BAT0 discharging")


def test_ups_on_battery_reads_battery(tmp_path: Path) -> None:
    supply(tmp_path, "ups0", type="UPS", online=0, status="Discharging", capacity=95)
    assert signal(tmp_path).read() == PowerReading("battery", None, "UPS ups0 on battery")


def test_no_power_supply_folder_reads_unknown(tmp_path: Path) -> None:
    reading = signal(tmp_path).read()
    assert reading.source == "unknown" and reading.battery_percent is None
    assert "cannot list" in reading.why and "power_supply" in reading.why


# --- psutil, for every OS but Linux -------------------------------------------------------


def psutil_signal(tmp_path: Path, sensors_battery: Any) -> PowerHostSignal:
    return signal(tmp_path, platform="darwin", sensors_battery=sensors_battery)


def test_psutil_no_battery_reads_ac(tmp_path: Path) -> None:
    assert psutil_signal(tmp_path, lambda: None).read() == PowerReading("ac", None, "no battery")


def test_psutil_unplugged_reads_battery(tmp_path: Path) -> None:
    bat = SimpleNamespace(percent=73.456, secsleft=3600, power_plugged=False)
    assert psutil_signal(tmp_path, lambda: bat).read() == PowerReading("battery", 73.5, "on battery")


def test_psutil_plugged_reads_ac(tmp_path: Path) -> None:
    bat = SimpleNamespace(percent=100, secsleft=psutil.POWER_TIME_UNLIMITED, power_plugged=True)
    assert psutil_signal(tmp_path, lambda: bat).read() == PowerReading("ac", 100.0, "power plugged in")


def test_psutil_plugged_not_known_reads_unknown(tmp_path: Path) -> None:
    bat = SimpleNamespace(percent=12, secsleft=psutil.POWER_TIME_UNKNOWN, power_plugged=None)
    reading = psutil_signal(tmp_path, lambda: bat).read()
    assert reading.source == "unknown" and reading.battery_percent == 12.0 and reading.why


def test_psutil_failing_or_missing_reads_unknown(tmp_path: Path) -> None:
    def broken() -> Any:
        raise RuntimeError("no power management here")

    reading = psutil_signal(tmp_path, broken).read()
    assert reading.source == "unknown" and "no power management here" in reading.why
    assert psutil_signal(tmp_path, None).read() == PowerReading(
        "unknown", None, "psutil cannot read the battery on this OS"
    )


# --- this host -------------------------------------------------------------------------------


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/sys/class/power_supply is Linux's")
def test_this_host_agrees_with_psutil(tmp_path: Path) -> None:
    reading = PowerHostSignal(PowerHostSignal.Options(), PluginContext(state_dir=tmp_path)).read()
    print(f"this host: {reading}")
    assert reading.source in ("ac", "battery", "unknown") and reading.why
    bat = psutil.sensors_battery()
    if bat is None:  # psutil sees no battery: a desktop, server or VM, which runs on mains
        assert reading == PowerReading("ac", None, "no battery")
    else:
        assert reading.battery_percent is not None and abs(reading.battery_percent - bat.percent) < 2
        if bat.power_plugged is not None and reading.source != "unknown":
            assert reading.source == ("ac" if bat.power_plugged else "battery")


def test_psutil_path_on_this_host(tmp_path: Path) -> None:
    reading = PowerHostSignal(PowerHostSignal.Options(), PluginContext(state_dir=tmp_path), platform="other").read()
    assert reading.source in ("ac", "battery", "unknown") and reading.why
