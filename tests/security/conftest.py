"""A real daemon in this process, for tests that need its app and its state side by side."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

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
