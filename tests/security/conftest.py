"""A real daemon in this process, for tests that need its app and its state side by side."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from arbiter.config.models import NodeConfig
from arbiter.daemon.core import Daemon

StartDaemon = Callable[..., Daemon]


def node_config(root: Path, **overrides: object) -> NodeConfig:
    (root / "tenants.d").mkdir(parents=True, exist_ok=True)
    return NodeConfig.model_validate(
        {
            "state_dir": str(root / "state"),
            "tenants_dirs": [str(root / "tenants.d")],
            "readers": ["cpu_time"],
            "stand_in_gpu": True,
            "tick_s": 0.5,
            "http": {"listen": "127.0.0.1:0"},
            **overrides,
        }
    )


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[StartDaemon]:
    """``start_daemon(**config)`` starts a daemon on a fresh state dir; all stop at the end."""
    started: list[Daemon] = []

    def start(**overrides: object) -> Daemon:
        daemon = Daemon(node_config(tmp_path / f"node{len(started)}", **overrides))
        daemon.start()
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.shutdown()


needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="an attack by another account needs root to make that account's processes and files"
)


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A folder under /tmp that every account may reach (pytest's own is root's alone), as a
    daemon's folder on a shared machine is; removed at the end."""
    root = Path("/tmp") / f"arbiter-security-{os.getpid()}-{time.monotonic_ns()}"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


class Background:
    """``fn`` running in a forked child as another account, beside the test; :meth:`join`
    returns what it returned (a JSON value)."""

    def __init__(self, user: str, fn: Callable[[], Any]) -> None:
        account = pwd.getpwnam(user)
        read_end, write_end = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - runs in the forked child
            try:
                os.close(read_end)
                os.setgroups([])
                os.setgid(account.pw_gid)
                os.setuid(account.pw_uid)
                try:
                    outcome = {"ok": fn()}
                except Exception as exc:
                    outcome = {"error": f"{type(exc).__name__}: {exc}"}
                os.write(write_end, json.dumps(outcome).encode())
            finally:
                os._exit(0)
        os.close(write_end)
        self._read_end = read_end

    def join(self) -> Any:
        with os.fdopen(self._read_end, "rb") as fh:
            data = fh.read()
        os.waitpid(self.pid, 0)
        outcome = json.loads(data or b'{"error": "the child said nothing"}')
        if "error" in outcome:
            raise AssertionError(f"the attacker failed: {outcome['error']}")
        return outcome["ok"]
