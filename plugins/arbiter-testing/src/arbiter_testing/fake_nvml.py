"""What every stand-in ``pynvml`` shares, for tests on hosts without an NVIDIA GPU.

``NVMLError`` carries NVML's code in ``.value`` and its message; init and shutdown are
counted, and ``init_error`` makes init fail the way a host without the driver does.  Each
test's stand-in adds the calls its plugin makes, answering them as pynvml does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

INVALID_ARGUMENT, NOT_SUPPORTED, NO_PERMISSION, NOT_FOUND, DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND = 2, 3, 4, 6, 9, 12


class FakeNVMLError(Exception):
    NAMES: ClassVar[dict[int, str]] = {
        INVALID_ARGUMENT: "Invalid Argument",
        NOT_SUPPORTED: "Not Supported",
        NO_PERMISSION: "Insufficient Permissions",
        NOT_FOUND: "Not Found",
        DRIVER_NOT_LOADED: "Driver Not Loaded",
        LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    }

    def __init__(self, value: int) -> None:
        super().__init__(self.NAMES.get(value, f"error {value}"))
        self.value = value


class FakePynvmlBase:
    """Stands in for the ``pynvml`` module: the calls every plugin makes."""

    NVMLError = FakeNVMLError
    NVML_ERROR_INVALID_ARGUMENT = INVALID_ARGUMENT
    NVML_ERROR_NOT_SUPPORTED = NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = NO_PERMISSION
    NVML_ERROR_NOT_FOUND = NOT_FOUND
    NVML_ERROR_DRIVER_NOT_LOADED = DRIVER_NOT_LOADED
    NVML_ERROR_LIBRARY_NOT_FOUND = LIBRARY_NOT_FOUND

    def __init__(self, gpus: Iterable[Any], init_error: int | None = None) -> None:
        self.gpus = list(gpus)
        self.init_error = init_error
        self.inits = self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise FakeNVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)
