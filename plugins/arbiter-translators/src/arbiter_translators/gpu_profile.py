"""``gpu_profile``: an NVIDIA GPU's power limit and locked clocks, through NVML, while a tenant
works on it, and put back afterwards.

NVML can read the power limit but not whether clocks are locked (nor to what), so what
:meth:`GpuProfileTranslator.read_profile` saves is partly a reading and partly a to-do list:
the power limit before the profile (restored as it was, or to the device's default limit when
it could not be read) and which locked clocks the profile sets (restored by unlocking them,
which also drops a lock someone else set before).

Setting any of these needs root (an administrator on Windows).  ``pynvml`` (the
``nvidia-ml-py`` distribution) is imported only when first needed, so hosts without it load
the plugin fine; tests pass a stand-in module instead.  Failures of apply and restore are
returned in the :class:`arbiter.plugin.ActionResult`, never raised into the daemon's loop.

It runs past 400 lines because its options, the saved record and the three steps that read,
apply and put back a profile go together: each step reads or writes that one record.
"""

from __future__ import annotations

import importlib
import json
import threading
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from arbiter.plugin import ActionResult, KindOptions, PluginContext, PluginError, Translator

#: the shape of what read_profile returns; a saved profile of another shape is not guessed at
SAVED_FORMAT = 1
NOT_INSTALLED = (
    "gpu_profile needs nvidia-ml-py (the pynvml module), which is not installed: install it into "
    "arbiter's environment, e.g. pip install 'nvidia-ml-py>=12'"
)
#: NVML's return codes and clock types, where the module does not name them (a stand-in)
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_DRIVER_NOT_LOADED = 9
ERROR_LIBRARY_NOT_FOUND = 12
CLOCK_GRAPHICS = 0
CLOCK_MEM = 2
#: no GPU clocks anywhere near this; a larger number is a typo (kHz, Hz)
MAX_CLOCK_MHZ = 100_000
#: nor draws this much (a whole multi-GPU board is well under it)
MAX_POWER_W = 10_000

#: what each setting needs of the hardware, told when NVML says it is not supported
_NEEDS = {
    "power": "setting a power limit needs a GPU with power management (Kepler or newer)",
    "gpu": "locking GPU clocks needs Volta or newer",
    "memory": "locking memory clocks needs Ampere or newer",
}
ROOT_HINT = (
    "changing a GPU's clocks or power limit needs root (an administrator on Windows): run the "
    "arbiter daemon as root, or take the setting out of this tenant's profile"
)


def _watts(milliwatts: int) -> str:
    return f"{milliwatts / 1000:g} W"


def _code(nvml: Any, name: str, default: int) -> int:
    return int(getattr(nvml, name, default))


# --- options -----------------------------------------------------------------------------------


class GpuProfileOptions(KindOptions):
    """``{kind: gpu_profile, device, power_limit_w, gpu_clocks_mhz, memory_clocks_mhz}``.

    Clocks are ``[min, max]`` in MHz (one number locks to it).  Values beyond what the device
    allows are adjusted to its range when applied, and the adjustment is told in the result.
    """

    kind: Literal["gpu_profile"] = "gpu_profile"
    device: int = Field(0, ge=0, description="the GPU's index, as nvidia-smi numbers them")
    power_limit_w: float | None = Field(None, description="the power limit to set, in watts")
    gpu_clocks_mhz: tuple[int, int] | None = Field(None, description="lock GPU clocks to [min, max] MHz")
    memory_clocks_mhz: tuple[int, int] | None = Field(None, description="lock memory clocks to [min, max] MHz")

    @field_validator("power_limit_w", mode="before")
    @classmethod
    def _power(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"power_limit_w is a number of watts, e.g. 250 (got {value!r})")
        if not 0 < value <= MAX_POWER_W:
            raise ValueError(f"power_limit_w is in watts, above 0 and at most {MAX_POWER_W} (got {value!r})")
        return value

    @field_validator("gpu_clocks_mhz", "memory_clocks_mhz", mode="before")
    @classmethod
    def _clocks(cls, value: Any, info: ValidationInfo) -> Any:
        name = info.field_name
        if value is None:
            return None
        # one number is a lock to that clock: [n, n]
        if isinstance(value, int) and not isinstance(value, bool):
            value = [value, value]
        if (
            not isinstance(value, list | tuple)
            or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        ):
            raise ValueError(
                f"{name} is [min, max] in whole MHz, e.g. [1200, 1800], or one number to lock to it (got {value!r})"
            )
        low, high = value
        if low <= 0:
            raise ValueError(f"{name}: clocks are above 0 MHz (got {low})")
        if high > MAX_CLOCK_MHZ:
            raise ValueError(f"{name}: {high} MHz is not a GPU clock; clocks are in MHz, e.g. 1800")
        if low > high:
            raise ValueError(f"{name} is [min, max]: min {low} MHz is above max {high} MHz")
        return (low, high)

    @model_validator(mode="after")
    def _sets_something(self) -> GpuProfileOptions:
        if self.power_limit_w is None and self.gpu_clocks_mhz is None and self.memory_clocks_mhz is None:
            raise ValueError("a gpu_profile sets at least one of power_limit_w, gpu_clocks_mhz and memory_clocks_mhz")
        return self

    def needs_trusted_file(self) -> str | None:
        return "applies GPU settings (power, clocks) as the daemon's account"


# --- what is saved -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SavedProfile:
    """What restore must do, as read_profile saved it (the JSON's fields, checked)."""

    device: int
    restore_power_limit: bool
    power_limit_mw: int | None  # None: not readable then; restore goes to the default limit
    reset_gpu_clocks: bool
    reset_memory_clocks: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "format": SAVED_FORMAT,
            "kind": "gpu_profile",
            "device": self.device,
            "restore_power_limit": self.restore_power_limit,
            "power_limit_mw": self.power_limit_mw,
            "reset_gpu_clocks": self.reset_gpu_clocks,
            "reset_memory_clocks": self.reset_memory_clocks,
        }

    @classmethod
    def from_json(cls, saved: Any) -> SavedProfile:
        """The saved profile, or ValueError saying why it is not one this kind wrote."""

        def why(reason: str) -> ValueError:
            shown = json.dumps(saved, default=repr)
            shown = shown if len(shown) <= 200 else shown[:197] + "..."
            return ValueError(f"the saved GPU profile cannot be restored: {reason} (saved: {shown})")

        if not isinstance(saved, dict):
            raise why("it is not a JSON object")
        if saved.get("kind") != "gpu_profile" or saved.get("format") != SAVED_FORMAT:
            raise why(f"it was not written by gpu_profile format {SAVED_FORMAT}")
        device = saved.get("device")
        if isinstance(device, bool) or not isinstance(device, int) or device < 0:
            raise why("device is not a GPU index")
        power = saved.get("power_limit_mw")
        if power is not None and (isinstance(power, bool) or not isinstance(power, int) or power <= 0):
            raise why("power_limit_mw is not a number of milliwatts")
        flags = {}
        for name in ("restore_power_limit", "reset_gpu_clocks", "reset_memory_clocks"):
            flag = saved.get(name, False)
            if not isinstance(flag, bool):
                raise why(f"{name} is not true or false")
            flags[name] = flag
        return cls(device=device, power_limit_mw=power, **flags)

    @property
    def changes_nothing(self) -> bool:
        return not (self.restore_power_limit or self.reset_gpu_clocks or self.reset_memory_clocks)


# --- the translator ----------------------------------------------------------------------------


class GpuProfileTranslator(Translator):
    """Applies a power limit and locked clocks to one GPU, and restores what was saved."""

    Options = GpuProfileOptions
    actions = frozenset({"profile"})

    def __init__(self, options: GpuProfileOptions, context: PluginContext, *, nvml: Any = None) -> None:
        super().__init__(options, context)
        self.options: GpuProfileOptions = options
        self._module = nvml  # a stand-in module for tests; None imports pynvml when first needed
        self._lock = threading.Lock()  # the daemon may call from more than one worker thread
        self._nvml: Any = None  # the module, once nvmlInit succeeded
        self._handles: dict[int, Any] = {}

    # NVML --------------------------------------------------------------------------------------

    def _start(self) -> Any:
        """The pynvml module with NVML initialised (once), or PluginError saying how to fix it.

        A failure is not remembered: the daemon may start before the driver has loaded, and a
        profile is applied seldom enough for the next call to try again."""
        if self._nvml is not None:
            return self._nvml
        nvml = self._module
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError:
                raise PluginError(NOT_INSTALLED) from None
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, OSError...: all mean no NVML
            raise PluginError(_init_failure(nvml, exc)) from None
        self._nvml = nvml
        return nvml

    def _handle(self, nvml: Any, index: int) -> Any:
        if index in self._handles:
            return self._handles[index]
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:
            try:
                count = int(nvml.nvmlDeviceGetCount())
            except Exception:
                count = None
            if count is not None and index >= count:
                listed = "no GPU" if count == 0 else f"GPUs 0 to {count - 1}"
                raise PluginError(f"there is no GPU {index}: NVML lists {listed}; set device to one of them") from None
            raise PluginError(f"NVML cannot open GPU {index}: {exc}") from None
        self._handles[index] = handle
        return handle

    def _device(self, index: int) -> tuple[Any, Any]:
        nvml = self._start()
        return nvml, self._handle(nvml, index)

    def available(self) -> tuple[bool, str]:
        with self._lock:
            try:
                self._device(self.options.device)
            except PluginError as exc:
                return False, str(exc)
        return True, ""

    def close(self) -> None:
        with self._lock:
            nvml, self._nvml, self._handles = self._nvml, None, {}
            if nvml is not None:
                try:
                    # NVML counts its initialisations: this ends only this translator's
                    nvml.nvmlShutdown()
                except Exception:
                    pass  # the driver went away; there is nothing left to release

    # the profile -------------------------------------------------------------------------------

    def read_profile(self, tenant: str) -> dict[str, Any]:
        # no memory of an earlier read here: the daemon restores through a fresh instance (the
        # rule may have changed), so only it knows whether the device still carries a profile,
        # and it reads only once the saved settings are restored
        with self._lock:
            nvml, handle = self._device(self.options.device)
            power_mw: int | None = None
            if self.options.power_limit_w is not None:
                try:
                    power_mw = int(nvml.nvmlDeviceGetPowerManagementLimit(handle))
                except Exception:
                    power_mw = None  # restore then goes back to the device's default limit
            saved = SavedProfile(
                device=self.options.device,
                restore_power_limit=self.options.power_limit_w is not None,
                power_limit_mw=power_mw,
                reset_gpu_clocks=self.options.gpu_clocks_mhz is not None,
                reset_memory_clocks=self.options.memory_clocks_mhz is not None,
            )
            return saved.to_json()

    def apply_profile(self, tenant: str) -> ActionResult:
        options = self.options
        index = options.device
        requested: list[str] = []
        errors: list[str] = []
        notes: list[str] = []
        with self._lock:
            try:
                nvml, handle = self._device(index)
            except PluginError as exc:
                return ActionResult(errors=(str(exc),))

            if options.power_limit_w is not None:
                asked = round(options.power_limit_w * 1000)  # NVML takes milliwatts
                milliwatts = asked
                try:
                    low, high = (int(v) for v in nvml.nvmlDeviceGetPowerManagementLimitConstraints(handle))
                except Exception:
                    notes.append(f"GPU {index}'s power limit range is not readable: {_watts(asked)} asked as it is")
                else:
                    milliwatts = min(max(asked, low), high)
                    if milliwatts != asked:
                        edge = "minimum" if asked < low else "maximum"
                        notes.append(
                            f"power limit {_watts(asked)} is beyond GPU {index}'s {edge} "
                            f"{_watts(milliwatts)}: set {_watts(milliwatts)}"
                        )
                what = f"GPU {index} power limit {_watts(milliwatts)}"
                requested.append(what)
                try:
                    nvml.nvmlDeviceSetPowerManagementLimit(handle, milliwatts)
                except Exception as exc:
                    errors.append(_call_failure(nvml, what, exc, "power"))

            for setting, clocks, clock_type, setter in (
                (
                    "gpu",
                    options.gpu_clocks_mhz,
                    _code(nvml, "NVML_CLOCK_GRAPHICS", CLOCK_GRAPHICS),
                    "nvmlDeviceSetGpuLockedClocks",
                ),
                (
                    "memory",
                    options.memory_clocks_mhz,
                    _code(nvml, "NVML_CLOCK_MEM", CLOCK_MEM),
                    "nvmlDeviceSetMemoryLockedClocks",
                ),
            ):
                if clocks is None:
                    continue
                low, high = clocks
                try:
                    top = int(nvml.nvmlDeviceGetMaxClockInfo(handle, clock_type))
                except Exception:
                    top = 0  # not readable: the driver itself keeps a lock within what it supports
                if top > 0 and high > top:
                    low, high = min(low, top), top
                    notes.append(
                        f"{setting} clocks {clocks[0]}-{clocks[1]} MHz reach beyond GPU {index}'s "
                        f"maximum {top} MHz: locked to {low}-{high} MHz"
                    )
                what = f"GPU {index} {setting} clocks locked to {low}-{high} MHz"
                requested.append(what)
                try:
                    getattr(nvml, setter)(handle, low, high)
                except Exception as exc:
                    errors.append(_call_failure(nvml, what, exc, setting))
        return ActionResult(requested=tuple(requested), errors=tuple(errors), note="; ".join(notes))

    def restore_profile(self, tenant: str, saved: dict[str, Any]) -> ActionResult:
        try:
            plan = SavedProfile.from_json(saved)
        except ValueError as exc:
            return ActionResult(errors=(str(exc),))
        index = plan.device
        requested: list[str] = []
        errors: list[str] = []
        with self._lock:
            if plan.changes_nothing:
                return ActionResult(note="the saved GPU profile changed nothing: nothing to restore")
            try:
                nvml, handle = self._device(index)
            except PluginError as exc:
                return ActionResult(errors=(str(exc),))

            # the reverse of apply's order
            for setting, reset, resetter in (
                ("memory", plan.reset_memory_clocks, "nvmlDeviceResetMemoryLockedClocks"),
                ("gpu", plan.reset_gpu_clocks, "nvmlDeviceResetGpuLockedClocks"),
            ):
                if not reset:
                    continue
                what = f"GPU {index} {setting} clocks unlocked"
                requested.append(what)
                try:
                    getattr(nvml, resetter)(handle)
                except Exception as exc:
                    errors.append(_call_failure(nvml, what, exc, setting))

            if plan.restore_power_limit:
                milliwatts = plan.power_limit_mw
                if milliwatts is not None:
                    what = f"GPU {index} power limit back to {_watts(milliwatts)}"
                else:  # the limit before was not readable: the device's default is the best guess
                    try:
                        milliwatts = int(nvml.nvmlDeviceGetPowerManagementDefaultLimit(handle))
                    except Exception as exc:
                        errors.append(
                            _call_failure(
                                nvml,
                                f"GPU {index} power limit: the one before was not read, nor the default",
                                exc,
                                "power",
                            )
                        )
                    else:
                        what = f"GPU {index} power limit back to its default {_watts(milliwatts)}"
                if milliwatts is not None:
                    requested.append(what)
                    try:
                        nvml.nvmlDeviceSetPowerManagementLimit(handle, milliwatts)
                    except Exception as exc:
                        errors.append(_call_failure(nvml, what, exc, "power"))
        return ActionResult(requested=tuple(requested), errors=tuple(errors))


def _init_failure(nvml: Any, exc: Exception) -> str:
    code = getattr(exc, "value", None)
    if code == _code(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", ERROR_LIBRARY_NOT_FOUND):
        return (
            f"NVML cannot initialise: {exc}: the NVIDIA driver (its libnvidia-ml) is not installed "
            "or not on the library path; install the driver (nvidia-smi should then list the GPU)"
        )
    if code == _code(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", ERROR_DRIVER_NOT_LOADED):
        return (
            f"NVML cannot initialise: {exc}: the NVIDIA kernel driver is not loaded; load it "
            "(nvidia-smi should then list the GPU)"
        )
    if code == _code(nvml, "NVML_ERROR_NO_PERMISSION", ERROR_NO_PERMISSION):
        return (
            f"NVML cannot initialise: {exc}: the daemon's user may not open the GPU devices "
            "(/dev/nvidia*); run it as root or as a user the devices allow"
        )
    return f"NVML cannot initialise: {exc}"


def _call_failure(nvml: Any, what: str, exc: Exception, setting: str) -> str:
    code = getattr(exc, "value", None)
    if code == _code(nvml, "NVML_ERROR_NO_PERMISSION", ERROR_NO_PERMISSION):
        return f"{what}: not permitted ({exc}): {ROOT_HINT}"
    if code == _code(nvml, "NVML_ERROR_NOT_SUPPORTED", ERROR_NOT_SUPPORTED):
        return f"{what}: this GPU does not support it ({exc}): {_NEEDS[setting]}"
    if code == _code(nvml, "NVML_ERROR_INVALID_ARGUMENT", ERROR_INVALID_ARGUMENT):
        return f"{what}: NVML refused the value ({exc}); nvidia-smi -q -d CLOCK,POWER shows what the GPU allows"
    if isinstance(exc, AttributeError):
        return f"{what}: this pynvml has no such call ({exc}); upgrade nvidia-ml-py"
    return f"{what}: NVML: {exc}"
