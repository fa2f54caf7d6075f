"""A protected program's end lets the fleet work it held go at once, not at the next tick:
its processes are watched for their end, and the last one's end brings the tick forward,
whether or not its parent has waited for it yet; a program whose processes come and go
brings no tick forward at each of their ends."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from arbiter.config.loader import load_node_config
from arbiter.daemon.core import Daemon
from arbiter.plugin import PluginContext, hookimpl
from arbiter.pluginmanager import build_plugin_manager
from arbiter_testing.node import HarnessNode
from arbiter_testing.waiting import wait_until


class Seen:
    """A node state observer: whether the node admitted GPU work, as last told; and the
    groups of processes the daemon last asked to have watched for their end."""

    def __init__(self) -> None:
        self.admitted: bool | None = None
        self.watched: list[frozenset[int]] = []
        self.lock = threading.Lock()

    @hookimpl
    def arbiter_node_state(self, state: dict[str, Any], context: PluginContext) -> None:
        with self.lock:
            self.admitted = bool(state["gpu_jobs_admitted"])

    @hookimpl(tryfirst=True)
    def arbiter_watch_processes(self, groups: list[frozenset[int]]) -> None:
        with self.lock:
            self.watched = list(groups)  # None: the shipped watch is asked next

    def watches(self, pids: frozenset[int]) -> bool:
        with self.lock:
            return any(pids <= g for g in self.watched)


@contextmanager
def daemon_for(node: HarnessNode, seen: Seen) -> Iterator[Daemon]:
    """The node's daemon, with ``seen`` among its plugins, once it has told that the game
    rule holds GPU work."""
    config, _ = load_node_config(node.config_path)
    host = build_plugin_manager(config.plugins, config.disable_plugins, extra=[("seen", seen)])
    daemon = Daemon(config, node.config_path, host=host)
    daemon.start()
    try:
        wait_until(lambda: seen.admitted is False, 30, "the node told: it admits no GPU work")
        yield daemon
    finally:
        daemon.shutdown()


def a_tick(daemon: Daemon) -> None:
    ticks = daemon.ticker.costs["ticks"]
    daemon.ticker.tick_soon()
    wait_until(lambda: daemon.ticker.costs["ticks"] > ticks, 10, "a tick")


def game_rule(match: dict[str, list[str]]) -> dict[str, Any]:
    return {"id": "game", "match": match, "pause_fleet": {"scope": "gpu"}}


def test_fleet_work_is_admitted_the_moment_the_protected_program_ends(tmp_path: Path) -> None:
    marker = f"sleep 1097.{os.getpid()}"
    node = HarnessNode(tmp_path, tick_s=60)  # no tick comes meanwhile by itself
    node.add_rule("game", game_rule({"cmdline": [marker]}))
    # a protected program of two processes: its end is the last one's
    shell = subprocess.Popen(["sh", "-c", f"{marker} & {marker} & wait"])
    seen = Seen()
    try:
        wait_until(lambda: len(_children(shell.pid)) == 2, 10, "both processes of the protected program")
        program = frozenset(_children(shell.pid))
        with daemon_for(node, seen) as daemon:
            assert not seen.watches(program)
            # watched from the tick after the one that first saw it, the same
            a_tick(daemon)
            wait_until(lambda: seen.watches(program), 10, "the program watched")
            for pid in program:
                os.kill(pid, 9)
            wait_until(lambda: seen.admitted is True, 10, "the node told: it admits GPU work again")
    finally:
        shell.kill()
        shell.wait()
        node.close()


def test_a_program_that_waits_for_its_parent_has_ended(tmp_path: Path) -> None:
    name = f"game{os.getpid() % 100000}"
    shutil.copy("/bin/sleep", tmp_path / name)
    node = HarnessNode(tmp_path / "node", tick_s=60)
    node.add_rule("game", game_rule({"name": [name]}))  # a zombie keeps its name
    game = subprocess.Popen([str(tmp_path / name), "600"])  # not waited for until the end
    seen = Seen()
    try:
        with daemon_for(node, seen) as daemon:
            a_tick(daemon)
            wait_until(lambda: seen.watches(frozenset({game.pid})), 10, "the program watched")
            os.kill(game.pid, 9)
            wait_until(lambda: seen.admitted is True, 10, "the node told: it admits GPU work again")
            assert _state(game.pid) == "Z"  # its parent, this test, has not waited for it
    finally:
        game.kill()
        game.wait()
        node.close()


def test_a_program_whose_processes_come_and_go_brings_no_tick_forward(tmp_path: Path) -> None:
    life = f"1.5{os.getpid()}"  # each process lives about 1.5 s, a new one every 0.3 s
    node = HarnessNode(tmp_path, tick_s=60)
    node.add_rule("game", game_rule({"cmdline": [f"sleep {life}"]}))
    # the shell's own command line names no process of the rule
    pool = subprocess.Popen(["sh", "-c", f"L={life}; while :; do sleep $L & sleep 0.3; done"])
    config, _ = load_node_config(node.config_path)
    daemon = Daemon(config, node.config_path)
    try:
        daemon.start()
        wait_until(lambda: daemon.ticker.costs["ticks"] >= 1, 30, "the first tick")
        daemon.ticker.tick_soon()  # what asks for a tick now and then (a reload, a job's end)
        ticks = daemon.ticker.costs["ticks"]
        time.sleep(10)  # a window in which a chain of ticks brought forward would show
        assert daemon.ticker.costs["ticks"] - ticks <= 2
    finally:
        daemon.shutdown()
        pool.kill()
        pool.wait()
        node.close()


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        return sorted(int(p) for p in fh.read().split())
