"""What every probe shares: its options, the host it looks at, and how it runs a command.

A probe looks at a host through three things it is given, so a test can fake any host:

- ``root``: the folder standing for ``/`` when the probe reads a fixed location (``/dev/kfd``,
  ``/etc/vulkan/icd.d``, ``/etc/cdi``).  Paths taken from the environment are used as given.
- ``env``: the environment (``VK_DRIVER_FILES``, ``OCL_ICD_VENDORS``, ``PATH``, ...); commands run
  with it too.
- ``run``: runs one command (no shell) with a timeout and returns what it printed.

Every command gets ``timeout_s`` (an option, 5 s unless set); a command that is missing, fails or
runs out of time turns into a plain sentence saying so.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import Field

from arbiter.plugin import KindOptions, PluginContext, Probe, start_child

DEFAULT_TIMEOUT_S = 5.0
#: the stdlib-only script that asks a native library (NVML, libcuda, libvulkan, libOpenCL, D3D12)
#: in a child process, so a broken driver can neither hang nor crash the caller
NATIVE_SCRIPT = Path(__file__).with_name("_native.py")


class ProbeOptions(KindOptions):
    """Options every probe takes."""

    #: seconds each command the probe runs may take before it is killed
    timeout_s: float = Field(default=DEFAULT_TIMEOUT_S, gt=0, le=120)


@dataclass(frozen=True)
class Completed:
    """What a finished command printed."""

    returncode: int
    stdout: str
    stderr: str = ""


#: ``run(argv, timeout_s, env)``: runs ``argv`` without a shell.  Raises ``FileNotFoundError``
#: when the program is not there and ``subprocess.TimeoutExpired`` when it ran out of time.
Runner = Callable[[Sequence[str], float, Mapping[str, str]], Completed]


def run_command(argv: Sequence[str], timeout_s: float, env: Mapping[str, str]) -> Completed:
    """Run ``argv`` (no shell, stdin closed) with ``env``; kill its whole process group on timeout."""
    program = shutil.which(argv[0], path=env.get("PATH", os.defpath))
    if program is None:
        raise FileNotFoundError(2, "not found on PATH", argv[0])
    posix = os.name == "posix"
    proc = start_child(
        [program, *argv[1:]],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
        errors="replace",
        # its own group, so a helper it started dies with it; the prober's session, so it keeps
        # the prober's lower priority where the scheduler groups by session
        process_group=0 if posix else None,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill(proc, posix)
        with contextlib.suppress(subprocess.TimeoutExpired):  # something still holds its pipes: do not wait
            proc.communicate(timeout=1.0)
        raise subprocess.TimeoutExpired(list(argv), timeout_s) from None
    return Completed(proc.returncode, out, err)


def _kill(proc: subprocess.Popen[str], posix: bool) -> None:
    try:
        if posix:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except OSError:
        pass  # already gone


def command_words(argv: Sequence[str]) -> str:
    """How a command is named in evidence: the program's base name and its arguments."""
    if Path(argv[0]) == Path(sys.executable):
        return "a child Python process"
    return " ".join([os.path.basename(argv[0]), *argv[1:]])


def failure_detail(text: str) -> str:
    """What a failed command's output says went wrong: its first and last error lines, else its last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    chosen = errors[:1] + errors[-1:] if len(errors) > 1 else errors or lines[-1:]
    return "; ".join(_strip_loader_prefix(line) for line in chosen)


def _strip_loader_prefix(line: str) -> str:
    marker = "Code 0 : "  # the Vulkan loader's "ERROR: [Loader Message] Code 0 : " prefix
    return line.split(marker, 1)[1] if marker in line else line


class ToolFailed(Exception):
    """A command could not give its output; ``str(exc)`` says why in plain words."""

    def __init__(self, why: str, missing: bool = False) -> None:
        super().__init__(why)
        self.missing = missing


def tool_output(run: Runner, argv: Sequence[str], timeout_s: float, env: Mapping[str, str]) -> str:
    """The standard output of ``argv``, or :class:`ToolFailed` saying why there is none."""
    words = command_words(argv)
    try:
        done = run(argv, timeout_s, env)
    except FileNotFoundError:
        raise ToolFailed(f"{os.path.basename(argv[0])} is not installed (not found on PATH)", missing=True) from None
    except subprocess.TimeoutExpired:
        raise ToolFailed(f"{words} did not finish within {timeout_s:g} s") from None
    except OSError as exc:
        raise ToolFailed(f"{words} could not run: {exc.strerror or exc}") from None
    if done.returncode != 0:
        detail = failure_detail(done.stderr) or failure_detail(done.stdout) or "no output"
        raise ToolFailed(f"{words} failed (exit {done.returncode}): {detail}")
    return done.stdout


def native_query(run: Runner, what: str, timeout_s: float, env: Mapping[str, str]) -> dict[str, Any]:
    """Ask ``_native.py`` about ``what`` (``cuda``, ``vulkan``, ``opencl``, ``directml``) in a child."""
    argv = [sys.executable, "-I", "-S", str(NATIVE_SCRIPT), what]
    text = tool_output(run, argv, timeout_s, env)
    try:
        report = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise ToolFailed(f"the {what} query printed no report: {failure_detail(text) or 'no output'}") from None
    if not isinstance(report, dict):
        raise ToolFailed(f"the {what} query printed no report")
    return report


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


class HostProbe(Probe):
    """A probe that looks at a host given as ``root``, ``env``, ``run`` and ``platform``.

    The daemon passes only ``options`` and ``context``: the probe then looks at this host.
    """

    Options = ProbeOptions

    def __init__(
        self,
        options: KindOptions,
        context: PluginContext,
        *,
        root: str | Path = "/",
        env: Mapping[str, str] | None = None,
        run: Runner = run_command,
        platform: str = sys.platform,
    ) -> None:
        super().__init__(options, context)
        self.root = Path(root)
        self.env: Mapping[str, str] = dict(os.environ if env is None else env)
        self.run = run
        self.platform = platform

    @property
    def timeout_s(self) -> float:
        return float(self.options.timeout_s)  # type: ignore[attr-defined]

    def host_path(self, path: str) -> Path:
        """``path`` (absolute, POSIX) under this probe's root."""
        return self.root.joinpath(*PurePosixPath(path).parts[1:])

    def tool(self, argv: Sequence[str]) -> str:
        return tool_output(self.run, argv, self.timeout_s, self.env)

    def native(self, what: str) -> dict[str, Any]:
        return native_query(self.run, what, self.timeout_s, self.env)

    def probe(self) -> tuple[bool, str]:
        try:
            return self.check()
        except Exception as exc:  # a probe says why, it never takes the caller down
            return False, f"the probe itself failed: {type(exc).__name__}: {exc}"

    def check(self) -> tuple[bool, str]:
        raise NotImplementedError
