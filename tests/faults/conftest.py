"""A real daemon, a protected program that is idle on the (fake) GPU and a fleet job beside it.

With the program idle, the job runs; each test then injects one real fault and checks that
the daemon fails safe: it keeps answering, holds the fleet work where the fault leaves
safety unknown, never signals the protected program, and ``explain`` names the fault with
a code and a remedy.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from arbiter_testing import GIB, write_state
from arbiter_testing.node import PYTHON, HarnessNode

MARKER = "faults-protected-standin"
HELD = {"held", "paused"}

#: the protected stand-in: idles, and notes every signal it can catch (SIGSTOP cannot be
#: caught, so its state is checked too)
PROTECTED = textwrap.dedent(
    """
    import signal, sys, time
    log = sys.argv[1]
    def note(signum, frame):
        with open(log, "a") as fh:
            fh.write(f"{signal.Signals(signum).name}\\n")
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT):
        signal.signal(s, note)
    while True:
        time.sleep(0.2)
    """
)


@dataclass
class Scene:
    """One node under test, with what the fault tests share."""

    node: HarnessNode
    root: Path
    gpu_file: Path
    protected: subprocess.Popen[bytes] | None = None

    @property
    def signal_log(self) -> Path:
        return self.root / "protected-signals.log"

    def gpu(self, share: float = 0.0, **doc: Any) -> None:
        """What the fake reader reads: the protected program at ``share`` of the GPU."""
        procs = {str(self.protected.pid): {"busy_share": share, "vram_bytes": GIB}} if self.protected else {}
        write_state(
            self.gpu_file, {"vram_total_bytes": 16 * GIB, "vram_free_bytes": 15 * GIB, "processes": procs, **doc}
        )

    def protect(self) -> None:
        """The rule that protects the stand-in by its GPU share."""
        self.node.add_rule("prot", {"id": "prot", "match": {"cmdline": [MARKER]}, "protect": {"metric": "gpu_share"}})

    def start_protected(self) -> subprocess.Popen[bytes]:
        script = self.root / "protected_standin.py"
        script.write_text(PROTECTED)
        self.protected = self.node.spawn([PYTHON, str(script), str(self.signal_log), MARKER])
        self.gpu(0.0)
        return self.protected

    def start(self, **env: str) -> None:
        """The daemon, then the protected program, seen running and idle."""
        self.gpu(0.0)
        self.node.start(timeout=30.0, **env)
        self.start_protected()
        self.node.wait_for(lambda: self.rule()["running"] and not self.rule()["using_gpu"], timeout=30)

    def rule(self, rid: str = "prot") -> dict[str, Any]:
        return self.node.known_rule(rid)

    def run_job(self, name: str = "fleet", *cmd: str) -> int:
        """A plain GPU job, seen running; its pid."""
        self.node.job_run(list(cmd) or [PYTHON, "-m", "arbiter.demo.job", "--plain"], "--name", name)
        pid: int = self.node.job_pid(name, timeout=30)
        self.node.wait_for(lambda: (self.node.job(name) or {}).get("state") == "run", timeout=30)
        return pid

    def held(self, name: str, code: str, says: str = "", timeout: float = 30.0) -> dict[str, Any]:
        """The job's reason with ``code`` (and ``says`` in its message), once the job is held or
        paused for it."""

        def found() -> dict[str, Any] | None:
            job = self.node.job(name) or {}
            if job.get("state") not in HELD:
                return None
            return next((r for r in job.get("reasons") or [] if r["code"] == code and says in r["message"]), None)

        return self.node.wait_for(found, timeout=timeout)  # type: ignore[no-any-return]

    def ticks(self, n: int = 3) -> None:
        """Wait until the daemon has ticked ``n`` more times (to see that something did not happen)."""
        start = self.node.status()["costs"]["ticks"]
        self.node.wait_for(lambda: self.node.status()["costs"]["ticks"] >= start + n, timeout=30 + 5 * n)

    def explain(self, subject: str | None = None) -> dict[str, Any]:
        """``arbiter explain --json``, as a person would run it."""
        args = [subject] if subject else []
        out = self.node.cli("explain", *args, "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)  # type: ignore[no-any-return]

    def explained(self, code: str, subject: str | None = None) -> dict[str, Any]:
        """The reason (or notice) with ``code`` that ``explain`` gives, with its remedy."""

        def found() -> dict[str, Any] | None:
            answer = self.explain(subject)
            for item in answer["items"]:
                for reason in [
                    *item.get("reasons", []),
                    *item.get("holds", []),
                    *item.get("notes", []),
                    *item.get("problems", []),
                ]:
                    if reason["code"] == code:
                        return reason  # type: ignore[no-any-return]
            return next((n for n in answer.get("notices", []) if n["code"] == code), None)

        reason: dict[str, Any] = self.node.wait_for(found, timeout=30, every=0.5)
        assert reason["message"] and reason["remedy"], reason
        return reason

    def assert_alive(self) -> None:
        assert self.node.daemon is not None and self.node.daemon.poll() is None, self.node.log()
        assert self.node.status()["pid"] == self.node.daemon.pid

    def assert_protected_untouched(self) -> None:
        assert self.protected is not None and self.protected.poll() is None, "the protected program is gone"
        assert psutil.Process(self.protected.pid).status() != psutil.STATUS_STOPPED
        signals = self.signal_log.read_text() if self.signal_log.exists() else ""
        assert signals == "", f"the protected program was signalled: {signals}"


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[Scene]:
    gpu_file = tmp_path / "gpu.json"
    node = HarnessNode(tmp_path, stand_in_gpu=False, readers=[{"kind": "fake", "state_file": str(gpu_file)}])
    s = Scene(node, tmp_path, gpu_file)
    s.gpu(0.0)
    try:
        yield s
    finally:
        node.stop()  # first: the daemon resumes what it paused
        if s.protected is not None and s.protected.poll() is None:
            s.protected.kill()  # it notes SIGTERM and goes on, as a program a user protects may
        node.close()
