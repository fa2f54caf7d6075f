"""A protected program's end lets the fleet work it held go at once, not at the next tick:
its processes are watched for their end, and the last one's end brings the tick forward; a
program whose processes each end within a tick brings none forward."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path
from typing import Any

from arbiter.config.loader import load_node_config
from arbiter.daemon.core import Daemon
from arbiter.plugin import PluginContext, hookimpl
from arbiter.pluginmanager import build_plugin_manager
from arbiter_testing.node import HarnessNode
from arbiter_testing.waiting import wait_until


class Admissions:
    """A node state observer: whether the node admitted GPU work, as last told; and the
    groups of processes the daemon last asked to have watched for their end."""

    def __init__(self) -> None:
        self.admitted: bool | None = None
        self.watched: list[frozenset[int]] | None = None
        self.lock = threading.Lock()

    @hookimpl(tryfirst=True)
    def arbiter_watch_exits(self, groups: list[frozenset[int]]) -> None:
        with self.lock:
            self.watched = list(groups)  # None: the shipped watch is asked next

    @hookimpl
    def arbiter_node_state(self, state: dict[str, Any], context: PluginContext) -> None:
        with self.lock:
            self.admitted = bool(state["gpu_jobs_admitted"])

    def last(self) -> bool | None:
        with self.lock:
            return self.admitted


def test_fleet_work_is_admitted_the_moment_the_protected_program_ends(tmp_path: Path) -> None:
    marker = f"sleep 1097.{os.getpid()}"
    node = HarnessNode(tmp_path, tick_s=60)  # no tick comes meanwhile by itself
    node.add_rule(
        "game",
        {"id": "game", "match": {"cmdline": [marker]}, "pause_fleet": {"scope": "gpu"}},
    )
    # a protected program of two processes: its end is the last one's
    shell = subprocess.Popen(["sh", "-c", f"{marker} & {marker} & wait"])
    config, _ = load_node_config(node.config_path)
    admissions = Admissions()
    host = build_plugin_manager(config.plugins, config.disable_plugins, extra=[("admissions", admissions)])
    daemon = Daemon(config, node.config_path, host=host)
    try:
        wait_until(lambda: len(_children(shell.pid)) == 2, 10, "both processes of the protected program")
        daemon.start()
        wait_until(lambda: admissions.last() is False, 30, "the node told: it admits no GPU work")
        program = frozenset(_children(shell.pid))
        assert not any(g & program for g in admissions.watched or [])
        # watched from the tick after the one that first saw it: a program whose processes
        # each end within a tick brings no tick forward
        daemon.ticker.tick_soon()
        wait_until(lambda: any(program <= g for g in admissions.watched or []), 10, "the program watched")
        for pid in _children(shell.pid):
            os.kill(pid, 9)
        wait_until(lambda: admissions.last() is True, 10, "the node told: it admits GPU work again")
    finally:
        daemon.shutdown()
        shell.kill()
        shell.wait()
        node.close()


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        return sorted(int(p) for p in fh.read().split())
