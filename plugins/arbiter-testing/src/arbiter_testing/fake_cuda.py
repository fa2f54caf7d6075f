"""A fake CUDA driver library and ``cuda-checkpoint`` utility, for the ``cuda_checkpoint``
translator on hosts without an NVIDIA GPU.

:func:`build` compiles ``fake_cuda.c`` (the driver's checkpoint calls, with their documented
signatures and states) into ``<folder>/libcuda.so.1``, and writes beside it an executable
``cuda-checkpoint`` with the utility's documented options that drives that library, as the
real utility drives the real one.  :class:`FakeCuda` marks which processes "use CUDA", sets
what a driver refuses for them, and reads back every call with the process's kernel state
at that moment.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_cuda.c")

_UTILITY = '''#!{python}
"""A stand-in for NVIDIA's cuda-checkpoint utility, over the fake driver library beside it."""
import ctypes, sys

STATES = ["running", "locked", "checkpointed", "failed"]
lib = ctypes.CDLL({library!r})


class LockArgs(ctypes.Structure):
    _fields_ = [("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint), ("reserved1", ctypes.c_uint64 * 7)]


def fail(rc):
    name = ctypes.c_char_p()
    lib.cuGetErrorName(rc, ctypes.byref(name))
    print(f"Error: {{(name.value or b'?').decode()}}", file=sys.stderr)
    sys.exit(1)


def act(action, pid, timeout):
    if action == "lock":
        args = LockArgs(timeoutMs=timeout) if timeout else None
        rc = lib.cuCheckpointProcessLock(pid, ctypes.byref(args) if args else None)
    else:
        rc = getattr(lib, "cuCheckpointProcess" + action.capitalize())(pid, None)
    if rc:
        fail(rc)


argv = sys.argv[1:]
if not argv or "--help" in argv or "-h" in argv:
    print("Operations:\\n--get-state --pid <pid>\\n--action lock | checkpoint | restore | unlock --pid <pid> [--timeout <ms>]\\n--toggle --pid <pid>")
    sys.exit(0)
opts = dict(zip(argv[::1], argv[1::1]))
pid = int(opts.get("--pid") or opts.get("-p") or 0)
timeout = int(opts.get("--timeout") or opts.get("-t") or 0)
lib.cuInit(0)
state = ctypes.c_int()
if "--get-state" in argv:
    rc = lib.cuCheckpointProcessGetState(pid, ctypes.byref(state))
    if rc:
        fail(rc)
    print(STATES[state.value])
elif "--action" in argv:
    act(opts["--action"], pid, timeout)
elif "--toggle" in argv:
    rc = lib.cuCheckpointProcessGetState(pid, ctypes.byref(state))
    if rc:
        fail(rc)
    steps = ["lock", "checkpoint"] if STATES[state.value] == "running" else ["restore", "unlock"]
    for step in steps:
        act(step, pid, timeout)
else:
    print("unknown operation", file=sys.stderr)
    sys.exit(2)
'''


def build(folder: Path, checkpoint: bool = True, utility: bool = True) -> Path:
    """Compile the fake library into ``folder/libcuda.so.1`` (without the checkpoint calls
    for ``checkpoint=False``: a driver older than them) and, with ``utility``, write
    ``folder/cuda-checkpoint``.  Returns the library's path."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("the fake CUDA driver needs a C compiler (cc or gcc) on PATH")
    folder.mkdir(parents=True, exist_ok=True)
    library = folder / "libcuda.so.1"
    flags = ["-DFAKE_CUDA_CHECKPOINT"] if checkpoint else []
    subprocess.run([cc, "-shared", "-fPIC", "-O1", *flags, "-o", str(library), str(SOURCE)], check=True)
    if utility:
        tool = folder / "cuda-checkpoint"
        tool.write_text(_UTILITY.format(python=sys.executable, library=str(library)))
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return library


@dataclass(frozen=True)
class Call:
    """One checkpoint call the fake driver answered."""

    op: str
    pid: int
    proc_state: str  # the target's kernel state then: R, S, T (stopped) ...
    result: int  # the CUresult it returned (0: success)


class FakeCuda:
    """The fake driver's per-process state, in ``folder`` (export it as ``FAKE_CUDA_DIR``)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    @property
    def env(self) -> dict[str, str]:
        return {"FAKE_CUDA_DIR": str(self.folder)}

    def uses_cuda(self, pid: int, flags: Iterable[str] = ()) -> None:
        """``pid`` holds CUDA state (running); ``flags``: ``uvm`` (its memory cannot be
        checkpointed), ``busy`` (its submitted work does not finish: a lock times out)."""
        (self.folder / str(pid)).write_text("running\n")
        (self.folder / f"{pid}.flags").write_text(" ".join(flags) + "\n")

    def state(self, pid: int) -> str | None:
        try:
            return (self.folder / str(pid)).read_text().strip()
        except FileNotFoundError:
            return None

    def calls(self) -> list[Call]:
        try:
            text = (self.folder / "calls.log").read_text()
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines():
            op, pid, proc_state, result = line.split()
            out.append(Call(op, int(pid), proc_state, int(result)))
        return out

    def clear_calls(self) -> None:
        try:
            os.unlink(self.folder / "calls.log")
        except FileNotFoundError:
            pass
