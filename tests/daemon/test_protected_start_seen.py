"""A protected program's start stops fleet work beside it at once, not at the next tick: the
programs started are judged by the matchers of the rules whose program does not run, and one
they select brings the tick forward; a program no rule selects brings none."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from arbiter.config.loader import load_node_config
from arbiter.daemon.core import Daemon
from arbiter.daemon.exits import ExitWatching
from arbiter.plugin import PluginContext, hookimpl
from arbiter.pluginmanager import build_plugin_manager
from arbiter.pluginsteps import drive
from arbiter_matchers import EXECS_KEY, _execs
from arbiter_testing.node import HarnessNode
from arbiter_testing.waiting import wait_until

needs_connector = pytest.mark.skipif(
    bool(_execs.unusable()), reason=f"programs cannot be seen starting here: {_execs.unusable()}"
)


class Seen:
    """A node state observer: whether the node admitted GPU work, as last told."""

    def __init__(self) -> None:
        self.admitted: bool | None = None
        self.lock = threading.Lock()

    @hookimpl
    def arbiter_node_state(self, state: dict[str, Any], context: PluginContext) -> None:
        with self.lock:
            self.admitted = bool(state["gpu_jobs_admitted"])


@contextmanager
def settled(node: HarnessNode, seen: Seen) -> Iterator[Daemon]:
    """The node's daemon, once it has told that it admits GPU work (no protected program)."""
    config, _ = load_node_config(node.config_path)
    host = build_plugin_manager(config.plugins, config.disable_plugins, extra=[("seen", seen)])
    daemon = Daemon(config, node.config_path, host=host)
    daemon.start()
    try:
        wait_until(lambda: seen.admitted is True, 30, "the node told: it admits GPU work")
        yield daemon
    finally:
        daemon.shutdown()


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def game_node(tmp_path: Path, marker: str) -> HarnessNode:
    node = HarnessNode(tmp_path, tick_s=60)  # no tick comes meanwhile by itself
    node.add_rule("game", {"id": "game", "match": {"cmdline": [marker]}, "pause_fleet": {"scope": "gpu"}})
    return node


def game(marker: str) -> subprocess.Popen[bytes]:
    """The protected program, started by a shell of its own: the daemon runs in this process,
    and a program this process starts is the daemon's child, whose start is never judged."""
    return subprocess.Popen(["sh", "-c", 'sh -c "sleep 600; :" "$0"; :', marker], start_new_session=True)


@needs_connector
def test_fleet_work_is_held_the_moment_the_protected_program_starts(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    marker = f"game-start-{os.getpid()}"
    node = game_node(tmp_path, marker)
    seen = Seen()
    try:
        with settled(node, seen) as daemon:
            ticks = daemon.ticker.costs["ticks"]
            # programs no rule selects, a burst of them: none brings a tick forward
            for _ in range(20):
                subprocess.run(["true"], check=True)
            procs.append(game(marker))
            wait_until(lambda: seen.admitted is False, 10, "the node told: it admits no GPU work")
            # the watch judges in order: the game's start brought the one tick forward
            assert daemon.ticker.costs["ticks"] - ticks == 1
    finally:
        node.close()


def test_a_burst_of_starts_brings_forward_one_tick_in_tick_s() -> None:
    host = build_plugin_manager(entry_points=False)
    watching = ExitWatching(host, {})
    asked = [0]

    def soon() -> None:
        asked[0] += 1

    drive(watching.watching({}, [], frozenset(), 60.0, soon), host.call)
    for _ in range(5):
        watching.started()
    assert asked[0] == 1


def test_where_the_connector_cannot_be_had_no_watch_and_the_tick_finds_the_start(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_execs, "unusable", lambda: "it needs CAP_NET_ADMIN, which this process does not have")
    marker = f"game-nowatch-{os.getpid()}"
    node = game_node(tmp_path, marker)
    seen = Seen()
    try:
        with settled(node, seen) as daemon:
            assert "CAP_NET_ADMIN" in str(daemon.ticker.observer.exits.scratch[EXECS_KEY])
            assert not any(t.name == "arbiter-execs" for t in threading.enumerate())
            procs.append(game(marker))
            daemon.ticker.tick_soon()  # the tick at its turn
            wait_until(lambda: seen.admitted is False, 10, "the node told: it admits no GPU work")
    finally:
        node.close()
