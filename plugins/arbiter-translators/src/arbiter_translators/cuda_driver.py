"""The CUDA driver's process checkpoint calls, reached two ways: the driver library itself
(``cuCheckpointProcessLock/Checkpoint/Restore/Unlock`` through ``ctypes``, CUDA 12.8 / driver
570 and later) or NVIDIA's ``cuda-checkpoint`` utility (driver 550 and later).

Both give the same small interface, :class:`Checkpointer`: the CUDA state of a process
(``running``, ``locked``, ``checkpointed``, ``failed``, or None for a process that holds no
CUDA state) and the four steps.  A step the driver refuses raises :class:`CheckpointRefused`
with the driver's own error name and text.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from typing import Protocol

from arbiter.plugin import run_child

#: the driver's process states (CUprocessState), by value
STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed", 4: "checkpointing", 5: "restoring"}
#: the first driver (``cuDriverGetVersion``) with the checkpoint calls in its library
DRIVER_API_VERSION = 12080
#: how long the utility may take for a step besides a lock's own timeout (a checkpoint
#: copies the process's device memory to host memory: seconds for tens of GiB)
UTILITY_STEP_S = 600.0
# CUresult values the translator tells apart
NOT_SUPPORTED = 801
TIMEOUT = 909


class CheckpointRefused(Exception):
    """The driver refused a step: ``name`` is its error name (CUDA_ERROR_...)."""

    def __init__(self, step: str, pid: int, name: str, text: str, code: int | None = None) -> None:
        super().__init__(f"{step} of pid {pid}: {name} ({text})" if text else f"{step} of pid {pid}: {name}")
        self.step, self.pid, self.name, self.text, self.code = step, pid, name, text, code

    @property
    def unsupported(self) -> bool:
        """The driver cannot checkpoint this process's memory (IPC or unified memory)."""
        return self.code == NOT_SUPPORTED or self.name == "CUDA_ERROR_NOT_SUPPORTED"

    @property
    def timed_out(self) -> bool:
        return self.code == TIMEOUT or self.name == "CUDA_ERROR_TIMEOUT"


class Unavailable(Exception):
    """This way of reaching the driver is not available here (``str()`` says why)."""


class Checkpointer(Protocol):
    name: str

    def state(self, pid: int) -> str | None: ...
    def lock(self, pid: int, timeout_ms: int) -> None: ...
    def checkpoint(self, pid: int) -> None: ...
    def restore(self, pid: int) -> None: ...
    def unlock(self, pid: int) -> None: ...


class _LockArgs(ctypes.Structure):
    # CUcheckpointLockArgs: a timeout, then reserved words the driver wants zero
    _fields_ = (("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint), ("reserved1", ctypes.c_uint64 * 7))


class DriverCheckpointer:
    """The driver library's checkpoint calls.  Raises :class:`Unavailable` when the library
    cannot be loaded, does not start, or predates them."""

    name = "driver"

    def __init__(self, library: str) -> None:
        try:
            lib = ctypes.CDLL(library)
        except OSError as exc:
            raise Unavailable(
                f"the CUDA driver library {library} cannot be loaded ({exc}): no NVIDIA driver here"
            ) from None
        version = ctypes.c_int(0)
        if not hasattr(lib, "cuDriverGetVersion") or lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
            raise Unavailable(f"{library} does not answer cuDriverGetVersion: it is not a CUDA driver library")
        self.version = version.value
        missing = [
            f
            for f in ("cuCheckpointProcessGetState", "cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint")
            if not hasattr(lib, f)
        ]
        if missing:
            raise Unavailable(
                f"the CUDA driver here is {format_version(self.version)}, which has no {missing[0]} "
                f"(process checkpoints came with {format_version(DRIVER_API_VERSION)}, driver 570); "
                "update the driver, or install NVIDIA's cuda-checkpoint utility (driver 550 and later)"
            )
        rc = lib.cuInit(0)
        if rc != 0:
            raise Unavailable(f"cuInit failed: {self._error(lib, rc)[0]} (is the GPU visible to the daemon?)")
        self._lib = lib
        for f in ("cuCheckpointProcessGetState", "cuCheckpointProcessCheckpoint", "cuCheckpointProcessRestore"):
            getattr(lib, f).argtypes = (ctypes.c_int, ctypes.c_void_p)
        lib.cuCheckpointProcessLock.argtypes = (ctypes.c_int, ctypes.POINTER(_LockArgs))
        lib.cuCheckpointProcessUnlock.argtypes = (ctypes.c_int, ctypes.c_void_p)

    @staticmethod
    def _error(lib: ctypes.CDLL, rc: int) -> tuple[str, str]:
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        if getattr(lib, "cuGetErrorName", None) is None or lib.cuGetErrorName(rc, ctypes.byref(name)) != 0:
            return f"CUresult {rc}", ""
        lib.cuGetErrorString(rc, ctypes.byref(text))
        return (name.value or b"").decode(errors="replace"), (text.value or b"").decode(errors="replace")

    def _check(self, step: str, pid: int, rc: int) -> None:
        if rc != 0:
            name, text = self._error(self._lib, rc)
            raise CheckpointRefused(step, pid, name, text, rc)

    def state(self, pid: int) -> str | None:
        value = ctypes.c_int(-1)
        if self._lib.cuCheckpointProcessGetState(pid, ctypes.byref(value)) != 0:
            return None  # the driver knows no CUDA state for it
        return STATES.get(value.value, f"state {value.value}")

    def lock(self, pid: int, timeout_ms: int) -> None:
        args = _LockArgs(timeoutMs=timeout_ms)
        self._check("lock", pid, self._lib.cuCheckpointProcessLock(pid, ctypes.byref(args)))

    def checkpoint(self, pid: int) -> None:
        self._check("checkpoint", pid, self._lib.cuCheckpointProcessCheckpoint(pid, None))

    def restore(self, pid: int) -> None:
        self._check("restore", pid, self._lib.cuCheckpointProcessRestore(pid, None))

    def unlock(self, pid: int) -> None:
        self._check("unlock", pid, self._lib.cuCheckpointProcessUnlock(pid, None))


class UtilityCheckpointer:
    """NVIDIA's ``cuda-checkpoint`` utility, one run per step.  A utility without
    ``--action`` (driver 550) toggles: lock and checkpoint in one run, restore and unlock in
    another, and a lock takes no timeout."""

    name = "utility"

    def __init__(self, utility: str) -> None:
        path = shutil.which(utility)
        if path is None:
            raise Unavailable(f"no {utility} on PATH (NVIDIA's cuda-checkpoint utility)")
        self.path = path
        try:
            shown = self._run(["--help"], 10.0)
        except CheckpointRefused as exc:
            raise Unavailable(f"{path} --help failed: {exc.text or exc.name}") from None
        self.actions = "--action" in shown

    def _run(self, args: list[str], timeout_s: float, step: str = "help", pid: int = 0) -> str:
        try:
            done = run_child([self.path, *args], capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise CheckpointRefused(step, pid, "CUDA_ERROR_TIMEOUT", f"{self.path} ran past {timeout_s:g}s") from None
        except OSError as exc:
            raise CheckpointRefused(step, pid, "cannot run", f"{self.path}: {exc.strerror or exc}") from None
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()
            name = next(
                (w.strip(":,.()") for w in said.split() if w.startswith("CUDA_ERROR")), f"exit {done.returncode}"
            )
            raise CheckpointRefused(step, pid, name, said)
        return str(done.stdout)

    def state(self, pid: int) -> str | None:
        try:
            said = self._run(["--get-state", "--pid", str(pid)], 10.0, "get-state", pid).strip()
        except CheckpointRefused:
            return None
        return said or None

    def _step(self, action: str, pid: int, extra: list[str] | None = None, timeout_s: float = UTILITY_STEP_S) -> None:
        self._run(["--action", action, "--pid", str(pid), *(extra or [])], timeout_s, action, pid)

    def lock(self, pid: int, timeout_ms: int) -> None:
        if self.actions:
            self._step("lock", pid, ["--timeout", str(timeout_ms)], timeout_ms / 1000 + 10.0)
        # a toggling utility locks as part of its checkpoint

    def checkpoint(self, pid: int) -> None:
        if self.actions:
            self._step("checkpoint", pid)
        else:
            self._run(["--toggle", "--pid", str(pid)], UTILITY_STEP_S, "checkpoint", pid)

    def restore(self, pid: int) -> None:
        if self.actions:
            self._step("restore", pid)
        else:
            self._run(["--toggle", "--pid", str(pid)], UTILITY_STEP_S, "restore", pid)

    def unlock(self, pid: int) -> None:
        if self.actions:
            self._step("unlock", pid)


def format_version(version: int) -> str:
    """12080 → "CUDA 12.8" (cuDriverGetVersion's encoding)."""
    return f"CUDA {version // 1000}.{version % 1000 // 10}"


def open_checkpointer(backend: str, library: str, utility: str) -> tuple[Checkpointer | None, str]:
    """The way to reach the driver (``auto``: the library, else the utility), or None and why
    neither is available."""
    whys: list[str] = []
    if backend in ("auto", "driver"):
        try:
            return DriverCheckpointer(library), ""
        except Unavailable as exc:
            whys.append(str(exc))
    if backend in ("auto", "utility"):
        try:
            return UtilityCheckpointer(utility), ""
        except Unavailable as exc:
            whys.append(str(exc))
    return None, "; ".join(whys)
