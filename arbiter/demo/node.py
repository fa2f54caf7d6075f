"""A throwaway node for ``arbiter demo``: a config in a folder, a daemon subprocess, jobs.

It drives real processes the way a person would; the tests' harness
(``arbiter_testing.node``) extends it with what tests wait for.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from arbiter.api.ops import Op
from arbiter.api.transport import DaemonUnavailable, request

PYTHON = sys.executable
#: how long a wait on the daemon goes before it fails: a deadline, not a delay (a passing wait
#: returns as soon as its condition holds), sized for a busy two-core machine
WAIT_S = 30.0


class LocalNode:
    def __init__(self, root: Path, **config: Any) -> None:
        self.root = root
        self.state_dir = root / "state"
        self.tenants = root / "tenants.d"
        self.tenants.mkdir(parents=True, exist_ok=True)
        self.config_path = root / "arbiter.yaml"
        # its own runtime folder: the daemon's pointer (how a command finds it without its
        # config) stays here, not among the machine's
        self.runtime = root / "runtime"
        self.runtime.mkdir(mode=0o700, exist_ok=True)
        self.config: dict[str, Any] = {
            "state_dir": str(self.state_dir),
            "tenants_dirs": [str(self.tenants)],
            "readers": ["cpu_time"],
            "stand_in_gpu": True,
            "tick_s": 0.5,
            "gpu_release_after_s": 2,
            "stop_grace_s": 2,
            "http": {"listen": "127.0.0.1:0"},
            **config,
        }
        self.write_config()
        self.daemon: subprocess.Popen[bytes] | None = None
        self.children: list[subprocess.Popen[bytes]] = []

    def write_config(self) -> None:
        self.config_path.write_text(yaml.safe_dump(self.config))

    def add_rule(self, name: str, rule: dict[str, Any] | str) -> Path:
        path = self.tenants / f"{name}.yaml"
        text = rule if isinstance(rule, str) else yaml.safe_dump(rule, sort_keys=False)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        return path

    @property
    def socket(self) -> Path:
        return self.state_dir / "arbiter.sock"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "ARBITER_CONFIG": str(self.config_path),
            "PYTHONUNBUFFERED": "1",
            "XDG_RUNTIME_DIR": str(self.runtime),
        }

    def start(self, timeout: float = 30.0, **env: str) -> None:
        """Start the daemon (with ``env`` added to its environment)."""
        # the daemon has its own copy of the descriptor: ours is closed once it is started
        with open(self.root / "daemon.log", "ab") as log:
            self.daemon = subprocess.Popen(
                [PYTHON, "-m", "arbiter", "run", "--config", str(self.config_path)],
                stdout=log,
                stderr=log,
                env={**self.env(), **env},
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.daemon.poll() is not None:
                raise RuntimeError(f"the daemon exited with {self.daemon.returncode}:\n{self.log()}")
            if (self.state_dir / "daemon.json").exists():
                try:
                    request(self.socket, "ping", timeout=2)
                    return
                except DaemonUnavailable:
                    pass
            time.sleep(0.05)
        raise RuntimeError(f"the daemon did not start within {timeout:g}s:\n{self.log()}")

    def log(self) -> str:
        try:
            return (self.root / "daemon.log").read_text()[-4000:]
        except FileNotFoundError:
            return ""

    def info(self) -> dict[str, Any]:
        return json.loads((self.state_dir / "daemon.json").read_text())  # type: ignore[no-any-return]

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        return request(self.socket, op, **args)

    def status(self) -> dict[str, Any]:
        return self.call(Op.STATUS)["status"]  # type: ignore[no-any-return]

    def job(self, name: str) -> dict[str, Any] | None:
        return next((j for j in self.status()["jobs"] if j["name"] == name), None)

    def spawn(self, args: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        kw.setdefault("env", self.env())
        proc = subprocess.Popen(args, **kw)
        self.children.append(proc)
        return proc

    def job_run(self, cmd: list[str], *options: str, **kw: Any) -> subprocess.Popen[bytes]:
        """``arbiter job run [options] -- cmd`` as its own process."""
        return self.spawn(
            [PYTHON, "-m", "arbiter", "job", "run", "--config", str(self.config_path), *options, "--", *cmd], **kw
        )

    def wait_for(self, predicate: Any, timeout: float = WAIT_S, every: float = 0.05) -> Any:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = predicate()
            except (DaemonUnavailable, KeyError, TypeError, IndexError):
                last = None
            if last:
                return last
            time.sleep(every)
        raise TimeoutError(f"condition not met within {timeout:g}s (last: {last!r})\n{self.log()}")

    def stop(self, timeout: float = 15.0) -> int | None:
        """Stop the daemon the way a service manager does (it resumes what it paused)."""
        if self.daemon is None or self.daemon.poll() is not None:
            return self.daemon.returncode if self.daemon else None
        self.daemon.send_signal(signal.SIGTERM)
        try:
            return self.daemon.wait(timeout)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
            return self.daemon.wait()

    def close(self) -> None:
        self.stop()  # first: the daemon resumes what it paused, so every child can exit
        for proc in reversed(self.children):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.children:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
