"""A phase that flips what the node admits is told to the node state observers (a fleet
scheduler's features) at once, without a whole tick: the tick's process table, readers and
sources, read again at that moment, took the cores the protected program and the jobs being
stopped needed."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from arbiter.config.loader import load_node_config
from arbiter.daemon.core import Daemon
from arbiter.plugin import PluginContext, hookimpl
from arbiter.pluginmanager import build_plugin_manager
from arbiter_testing.node import HarnessNode
from arbiter_testing.waiting import wait_until


class Observer:
    """A node state observer: what it was told, in order."""

    def __init__(self) -> None:
        self.admitted: list[bool] = []
        self.lock = threading.Lock()

    @hookimpl
    def arbiter_node_state(self, state: dict[str, Any], context: PluginContext) -> None:
        with self.lock:
            self.admitted.append(bool(state["gpu_jobs_admitted"]))

    def last(self) -> bool | None:
        with self.lock:
            return self.admitted[-1] if self.admitted else None


def phase(path: Path, value: str) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps({"event": "status", "phase": value}) + "\n")


def test_an_admission_change_is_told_at_once_and_the_tick_keeps_its_turn(tmp_path: Path) -> None:
    events = tmp_path / "phase.jsonl"
    events.touch()
    node = HarnessNode(tmp_path, tick_s=60, reflex_process=False)  # no tick comes meanwhile by itself
    node.add_rule(
        "p",
        {
            "id": "p",
            "match": {"cmdline": ["sleep 1091"]},
            "immediate": True,
            "during": [
                {
                    "source": {"kind": "jsonl", "path": str(events), "event": "status", "field": "phase", "on": ["on"]},
                    "pause_fleet": {"scope": "all"},
                }
            ],
        },
    )
    node.spawn(["sleep", "1091"])
    config, _ = load_node_config(node.config_path)
    observer = Observer()
    host = build_plugin_manager(config.plugins, config.disable_plugins, extra=[("observer", observer)])
    daemon = Daemon(config, node.config_path, host=host)
    daemon.start()
    try:
        wait_until(lambda: observer.last() is True, 30, "the node state told: it admits GPU work")
        ticks = daemon.ticker.costs["ticks"]
        phase(events, "on")
        wait_until(lambda: observer.last() is False, 10, "the node state told: it admits none")
        phase(events, "off")
        wait_until(lambda: observer.last() is True, 10, "the node state told: it admits GPU work again")
        assert daemon.ticker.costs["ticks"] == ticks  # the hour's tick is not brought forward
        daemon.ticker.tick_soon()  # a tick asked for still comes at once
        wait_until(lambda: daemon.ticker.costs["ticks"] > ticks, 10, "the tick asked for")
    finally:
        daemon.shutdown()
        node.close()
