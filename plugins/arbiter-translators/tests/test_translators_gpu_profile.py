"""``gpu_profile`` against a stand-in pynvml that keeps one GPU's power limit and clock locks.

There is no NVIDIA GPU here; the stand-in answers the calls the translator makes the way pynvml
does (milliwatts, ``NVMLError`` with ``.value``, Insufficient Permissions for a user that is not
root, Not Supported for what the GPU cannot do) and records every call that changed something.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from arbiter.plugin import ActionResult, PluginContext, PluginError, Translator
from arbiter_testing.fake_nvml import (
    DRIVER_NOT_LOADED,
    INVALID_ARGUMENT,
    LIBRARY_NOT_FOUND,
    NO_PERMISSION,
    NOT_SUPPORTED,
    FakeNVMLError,
    FakePynvmlBase,
)
from arbiter_translators import GpuProfileTranslator, arbiter_register_translators
from arbiter_translators.gpu_profile import NOT_INSTALLED, ROOT_HINT


class FakeGpu:
    def __init__(
        self,
        limit_mw: int = 300_000,
        default_mw: int = 350_000,
        range_mw: tuple[int, int] = (100_000, 400_000),
        max_gpu_mhz: int = 1980,
        max_mem_mhz: int = 2619,
    ) -> None:
        self.limit_mw = limit_mw
        self.default_mw = default_mw
        self.range_mw = range_mw
        self.max_clock = {0: max_gpu_mhz, 2: max_mem_mhz}
        self.gpu_lock: tuple[int, int] | None = None  # not readable through NVML: the test looks
        self.mem_lock: tuple[int, int] | None = None
        self.unsupported: set[str] = set()  # names of calls the GPU does not support
        self.unreadable_limit = False


class FakePynvml(FakePynvmlBase):
    """Stands in for the ``pynvml`` module."""

    NVML_CLOCK_GRAPHICS = 0
    NVML_CLOCK_MEM = 2

    def __init__(self, gpus: Iterable[FakeGpu] = (), root: bool = True, init_error: int | None = None) -> None:
        super().__init__(list(gpus) or [FakeGpu()], init_error)
        self.root = root
        self.changes: list[tuple[Any, ...]] = []

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if not 0 <= index < len(self.gpus):
            raise FakeNVMLError(INVALID_ARGUMENT)
        gpu: FakeGpu = self.gpus[index]
        return gpu

    def _check(self, gpu: FakeGpu, call: str, changes: bool) -> None:
        if call in gpu.unsupported:
            raise FakeNVMLError(NOT_SUPPORTED)
        if changes and not self.root:  # every device command needs root
            raise FakeNVMLError(NO_PERMISSION)

    def nvmlDeviceGetPowerManagementLimit(self, gpu: FakeGpu) -> int:
        self._check(gpu, "limit", changes=False)
        if gpu.unreadable_limit:
            raise FakeNVMLError(NOT_SUPPORTED)
        return gpu.limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, gpu: FakeGpu) -> int:
        self._check(gpu, "limit", changes=False)
        return gpu.default_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, gpu: FakeGpu) -> list[int]:
        self._check(gpu, "limit", changes=False)
        return list(gpu.range_mw)

    def nvmlDeviceSetPowerManagementLimit(self, gpu: FakeGpu, limit: int) -> None:
        self._check(gpu, "limit", changes=True)
        if not gpu.range_mw[0] <= limit <= gpu.range_mw[1]:
            raise FakeNVMLError(INVALID_ARGUMENT)
        gpu.limit_mw = limit
        self.changes.append(("power", limit))

    def nvmlDeviceGetMaxClockInfo(self, gpu: FakeGpu, clock_type: int) -> int:
        return gpu.max_clock[clock_type]

    def nvmlDeviceSetGpuLockedClocks(self, gpu: FakeGpu, low: int, high: int) -> None:
        self._check(gpu, "gpu", changes=True)
        gpu.gpu_lock = (low, high)
        self.changes.append(("gpu", low, high))

    def nvmlDeviceResetGpuLockedClocks(self, gpu: FakeGpu) -> None:
        self._check(gpu, "gpu", changes=True)
        gpu.gpu_lock = None
        self.changes.append(("gpu reset",))

    def nvmlDeviceSetMemoryLockedClocks(self, gpu: FakeGpu, low: int, high: int) -> None:
        self._check(gpu, "memory", changes=True)
        gpu.mem_lock = (low, high)
        self.changes.append(("memory", low, high))

    def nvmlDeviceResetMemoryLockedClocks(self, gpu: FakeGpu) -> None:
        self._check(gpu, "memory", changes=True)
        gpu.mem_lock = None
        self.changes.append(("memory reset",))


def options(**fields: Any) -> Any:
    return GpuProfileTranslator.Options.model_validate({"kind": "gpu_profile", **fields})


def profile(nvml: Any, tmp_path: Path, **fields: Any) -> GpuProfileTranslator:
    return GpuProfileTranslator(options(**fields), PluginContext(state_dir=tmp_path), nvml=nvml)


def stored(saved: dict[str, Any]) -> dict[str, Any]:
    """What the daemon gets back from SQLite: the JSON it wrote."""
    back: dict[str, Any] = json.loads(json.dumps(saved))
    return back


# --- registration and the base class -----------------------------------------------------------


def test_registered_as_gpu_profile_with_the_profile_action() -> None:
    kinds: dict[str, type] = {}
    arbiter_register_translators(lambda name, cls: kinds.__setitem__(name, cls))
    assert kinds["gpu_profile"] is GpuProfileTranslator
    assert GpuProfileTranslator.actions == frozenset({"profile"})


def test_a_translator_without_profiles_raises_from_the_base_class(tmp_path: Path) -> None:
    plain = Translator(options(power_limit_w=200), PluginContext(state_dir=tmp_path))
    for call in (
        lambda: plain.read_profile("t"),
        lambda: plain.apply_profile("t"),
        lambda: plain.restore_profile("t", {}),
    ):
        with pytest.raises(PluginError, match=r"this translator applies no GPU profile .*'t'.*gpu_profile"):
            call()


# --- read → apply → restore ---------------------------------------------------------------------


def test_read_apply_restore_round_trips_to_the_saved_values(tmp_path: Path) -> None:
    gpu = FakeGpu(limit_mw=280_000)
    nvml = FakePynvml([gpu])
    t = profile(nvml, tmp_path, power_limit_w=220, gpu_clocks_mhz=[1200, 1800], memory_clocks_mhz=[2000, 2619])

    saved = t.read_profile("trainer")
    assert saved == {
        "format": 1,
        "kind": "gpu_profile",
        "device": 0,
        "restore_power_limit": True,
        "power_limit_mw": 280_000,
        "reset_gpu_clocks": True,
        "reset_memory_clocks": True,
    }
    assert stored(saved) == saved

    applied = t.apply_profile("trainer")
    assert applied == ActionResult(
        requested=(
            "GPU 0 power limit 220 W",
            "GPU 0 gpu clocks locked to 1200-1800 MHz",
            "GPU 0 memory clocks locked to 2000-2619 MHz",
        )
    )
    assert (gpu.limit_mw, gpu.gpu_lock, gpu.mem_lock) == (220_000, (1200, 1800), (2000, 2619))
    assert t.apply_profile("trainer").ok and gpu.limit_mw == 220_000  # idempotent

    restored = t.restore_profile("trainer", stored(saved))
    assert restored == ActionResult(
        requested=("GPU 0 memory clocks unlocked", "GPU 0 gpu clocks unlocked", "GPU 0 power limit back to 280 W")
    )
    assert (gpu.limit_mw, gpu.gpu_lock, gpu.mem_lock) == (280_000, None, None)
    assert nvml.inits == 1  # NVML is initialised once
    assert t.restore_profile("trainer", stored(saved)).ok  # idempotent
    assert (gpu.limit_mw, gpu.gpu_lock, gpu.mem_lock) == (280_000, None, None)
    t.close()
    t.close()
    assert nvml.shutdowns == 1


def test_only_what_the_profile_sets_is_saved_and_restored(tmp_path: Path) -> None:
    gpu = FakeGpu()
    nvml = FakePynvml([gpu])
    t = profile(nvml, tmp_path, gpu_clocks_mhz=1500)  # one number locks to it
    saved = t.read_profile("llm")
    assert saved["restore_power_limit"] is False and saved["power_limit_mw"] is None
    assert saved["reset_gpu_clocks"] and not saved["reset_memory_clocks"]
    assert t.apply_profile("llm").ok and gpu.gpu_lock == (1500, 1500)
    assert t.restore_profile("llm", saved).requested == ("GPU 0 gpu clocks unlocked",)
    assert nvml.changes == [("gpu", 1500, 1500), ("gpu reset",)]  # the power limit was never touched


def test_restore_after_a_crash_in_a_new_process(tmp_path: Path) -> None:
    gpu = FakeGpu(limit_mw=300_000)
    nvml = FakePynvml([FakeGpu(), gpu])
    before = profile(nvml, tmp_path, device=1, power_limit_w=150, memory_clocks_mhz=[800, 1000])
    saved = stored(before.read_profile("diffusion"))
    assert before.apply_profile("diffusion").ok
    # kill -9: the daemon starts again, perhaps with the rule file changed since
    after = profile(FakePynvml([FakeGpu(), gpu]), tmp_path, device=0, power_limit_w=100)
    result = after.restore_profile("diffusion", saved)
    assert result.ok and result.requested == ("GPU 1 memory clocks unlocked", "GPU 1 power limit back to 300 W")
    assert (gpu.limit_mw, gpu.mem_lock) == (300_000, None)


def test_an_unreadable_power_limit_is_restored_to_the_default(tmp_path: Path) -> None:
    gpu = FakeGpu(limit_mw=300_000, default_mw=350_000)
    gpu.unreadable_limit = True
    t = profile(FakePynvml([gpu]), tmp_path, power_limit_w=200)
    saved = t.read_profile("t")
    assert saved["restore_power_limit"] and saved["power_limit_mw"] is None
    assert t.apply_profile("t").ok and gpu.limit_mw == 200_000
    result = t.restore_profile("t", saved)
    assert result == ActionResult(requested=("GPU 0 power limit back to its default 350 W",))
    assert gpu.limit_mw == 350_000


# --- clamping ------------------------------------------------------------------------------------


def test_a_power_limit_beyond_the_device_range_is_clamped_and_told(tmp_path: Path) -> None:
    gpu = FakeGpu(range_mw=(100_000, 400_000))
    high = profile(FakePynvml([gpu]), tmp_path, power_limit_w=450.5).apply_profile("t")
    assert high.ok and high.requested == ("GPU 0 power limit 400 W",) and gpu.limit_mw == 400_000
    assert high.note == "power limit 450.5 W is beyond GPU 0's maximum 400 W: set 400 W"

    low = profile(FakePynvml([gpu]), tmp_path, power_limit_w=50).apply_profile("t")
    assert low.ok and gpu.limit_mw == 100_000
    assert low.note == "power limit 50 W is beyond GPU 0's minimum 100 W: set 100 W"

    inside = profile(FakePynvml([gpu]), tmp_path, power_limit_w=250).apply_profile("t")
    assert inside.note == "" and gpu.limit_mw == 250_000


def test_clocks_above_the_device_maximum_are_clamped_and_told(tmp_path: Path) -> None:
    gpu = FakeGpu(max_gpu_mhz=1980, max_mem_mhz=2619)
    result = profile(
        FakePynvml([gpu]), tmp_path, gpu_clocks_mhz=[2100, 2500], memory_clocks_mhz=[1000, 3000]
    ).apply_profile("t")
    assert result.ok
    assert (gpu.gpu_lock, gpu.mem_lock) == ((1980, 1980), (1000, 2619))
    assert result.note == (
        "gpu clocks 2100-2500 MHz reach beyond GPU 0's maximum 1980 MHz: locked to 1980-1980 MHz; "
        "memory clocks 1000-3000 MHz reach beyond GPU 0's maximum 2619 MHz: locked to 1000-2619 MHz"
    )


# --- failures are returned, with what to do -------------------------------------------------------


def test_pynvml_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    t = GpuProfileTranslator(options(power_limit_w=200), PluginContext(state_dir=tmp_path))
    result = t.apply_profile("t")
    assert result.errors == (NOT_INSTALLED,) and "pip install 'nvidia-ml-py>=12'" in NOT_INSTALLED
    assert t.restore_profile(
        "t", {"format": 1, "kind": "gpu_profile", "device": 0, "restore_power_limit": True}
    ).errors == (NOT_INSTALLED,)
    assert t.available() == (False, NOT_INSTALLED)
    with pytest.raises(PluginError, match="nvidia-ml-py"):
        t.read_profile("t")  # nothing is read, so the daemon applies nothing


@pytest.mark.parametrize(
    ("code", "hint"),
    [
        (LIBRARY_NOT_FOUND, "install the driver"),
        (DRIVER_NOT_LOADED, "kernel driver is not loaded"),
    ],
)
def test_no_driver(tmp_path: Path, code: int, hint: str) -> None:
    nvml = FakePynvml(init_error=code)
    t = profile(nvml, tmp_path, power_limit_w=200)
    result = t.apply_profile("t")
    assert not result.ok and result.errors[0].startswith("NVML cannot initialise: ") and hint in result.errors[0]
    nvml.init_error = None  # the driver loaded meanwhile: the next call starts NVML
    assert t.apply_profile("t").ok and nvml.inits == 1


def test_not_root_is_an_error_that_says_so_and_how_to_fix_it(tmp_path: Path) -> None:
    gpu = FakeGpu(limit_mw=300_000)
    nvml = FakePynvml([gpu], root=False)
    t = profile(nvml, tmp_path, power_limit_w=200, gpu_clocks_mhz=[1200, 1800])
    saved = t.read_profile("t")  # reading needs no root
    assert saved["power_limit_mw"] == 300_000
    result = t.apply_profile("t")  # returned, not raised
    assert result.requested == ("GPU 0 power limit 200 W", "GPU 0 gpu clocks locked to 1200-1800 MHz")
    assert result.errors == (
        f"GPU 0 power limit 200 W: not permitted (Insufficient Permissions): {ROOT_HINT}",
        f"GPU 0 gpu clocks locked to 1200-1800 MHz: not permitted (Insufficient Permissions): {ROOT_HINT}",
    )
    assert "needs root" in ROOT_HINT and "run the arbiter daemon as root" in ROOT_HINT
    assert gpu.limit_mw == 300_000 and nvml.changes == []

    failed = t.restore_profile("t", saved)
    assert failed.requested == ("GPU 0 gpu clocks unlocked", "GPU 0 power limit back to 300 W")
    assert len(failed.errors) == 2 and all("not permitted" in e and ROOT_HINT in e for e in failed.errors)
    nvml.root = True  # the same saved values, tried again
    assert t.restore_profile("t", saved).ok and gpu.limit_mw == 300_000


def test_a_setting_the_gpu_cannot_do_fails_alone(tmp_path: Path) -> None:
    gpu = FakeGpu()
    gpu.unsupported.add("memory")
    result = profile(FakePynvml([gpu]), tmp_path, power_limit_w=200, memory_clocks_mhz=[800, 900]).apply_profile("t")
    assert gpu.limit_mw == 200_000  # the power limit still went through
    assert result.errors == (
        "GPU 0 memory clocks locked to 800-900 MHz: this GPU does not support it "
        "(Not Supported): locking memory clocks needs Ampere or newer",
    )


def test_a_gpu_that_does_not_exist(tmp_path: Path) -> None:
    t = profile(FakePynvml([FakeGpu(), FakeGpu()]), tmp_path, device=2, power_limit_w=200)
    expected = "there is no GPU 2: NVML lists GPUs 0 to 1; set device to one of them"
    assert t.apply_profile("t").errors == (expected,)
    assert t.available() == (False, expected)
    with pytest.raises(PluginError, match="there is no GPU 2"):
        t.read_profile("t")


def test_a_pynvml_without_the_call_is_an_error_not_a_crash(tmp_path: Path) -> None:
    class OldPynvml(FakePynvml):
        nvmlDeviceSetMemoryLockedClocks = None  # type: ignore[assignment]

    result = profile(OldPynvml(), tmp_path, memory_clocks_mhz=[800, 900]).apply_profile("t")
    assert len(result.errors) == 1 and result.errors[0].startswith("GPU 0 memory clocks locked to 800-900 MHz: ")


@pytest.mark.parametrize(
    "saved",
    [
        None,
        [],
        {"kind": "http_post"},
        {"format": 2, "kind": "gpu_profile", "device": 0},
        {"format": 1, "kind": "gpu_profile", "device": -1},
        {"format": 1, "kind": "gpu_profile", "device": 0, "power_limit_mw": "300 W", "restore_power_limit": True},
        {"format": 1, "kind": "gpu_profile", "device": 0, "reset_gpu_clocks": "yes"},
    ],
)
def test_a_saved_profile_it_did_not_write_is_an_error(tmp_path: Path, saved: Any) -> None:
    nvml = FakePynvml()
    result = profile(nvml, tmp_path, power_limit_w=200).restore_profile("t", saved)
    assert len(result.errors) == 1 and result.errors[0].startswith("the saved GPU profile cannot be restored: ")
    assert nvml.changes == []


def test_a_saved_profile_that_changed_nothing(tmp_path: Path) -> None:
    nvml = FakePynvml(init_error=DRIVER_NOT_LOADED)  # nothing to do, so NVML is not needed
    result = profile(nvml, tmp_path, power_limit_w=200).restore_profile(
        "t", {"format": 1, "kind": "gpu_profile", "device": 0}
    )
    assert result.ok and result.requested == () and "nothing to restore" in result.note


# --- options ---------------------------------------------------------------------------------------


def test_options_defaults() -> None:
    o = options(power_limit_w=250)
    assert (o.device, o.power_limit_w, o.gpu_clocks_mhz, o.memory_clocks_mhz) == (0, 250, None, None)
    assert options(gpu_clocks_mhz=[1200, 1800]).gpu_clocks_mhz == (1200, 1800)
    assert options(memory_clocks_mhz=(900, 900)).memory_clocks_mhz == (900, 900)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "sets at least one of power_limit_w, gpu_clocks_mhz and memory_clocks_mhz"),
        ({"device": 0}, "sets at least one of"),
        ({"power_limit_w": 0}, "power_limit_w is in watts, above 0"),
        ({"power_limit_w": -5}, "power_limit_w is in watts, above 0"),
        ({"power_limit_w": 50_000}, "at most 10000"),
        ({"power_limit_w": "250W"}, "power_limit_w is a number of watts"),
        ({"power_limit_w": True}, "power_limit_w is a number of watts"),
        ({"gpu_clocks_mhz": [1800, 1200]}, "min 1800 MHz is above max 1200 MHz"),
        ({"gpu_clocks_mhz": [1200]}, "gpu_clocks_mhz is [min, max] in whole MHz"),
        ({"gpu_clocks_mhz": [1200, 1500, 1800]}, "gpu_clocks_mhz is [min, max]"),
        ({"memory_clocks_mhz": [1.5, 2]}, "memory_clocks_mhz is [min, max] in whole MHz"),
        ({"memory_clocks_mhz": [0, 900]}, "clocks are above 0 MHz"),
        ({"gpu_clocks_mhz": [1_200_000, 1_800_000]}, "is not a GPU clock; clocks are in MHz"),
        ({"device": -1, "power_limit_w": 200}, "greater than or equal to 0"),
        ({"power_limit_w": 200, "clocks": [1, 2]}, "Extra inputs are not permitted"),
    ],
)
def test_options_errors(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        options(**fields)
    assert message in str(caught.value)
