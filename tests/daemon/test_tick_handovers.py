"""A tick hands its sources' readings to the plugin pool together: with the shipped rules'
busy probes and a phase source (seventeen source calls), the whole tick wakes a pool thread a
handful of times, not once a call."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

from arbiter.config.loader import load_node_config
from arbiter.daemon.core import Daemon
from arbiter.daemon.inbox import drained
from arbiter.plugin import hookimpl
from arbiter.pluginmanager import build_plugin_manager
from arbiter_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def _calls() -> ModuleType:
    return load_script(ROOT / "bench" / "costcalls.py", "costcalls")


def _node(tmp_path: Path) -> tuple[Any, Any]:
    """The cost bench's node config (the shipped rules, a phase source) and its fixed table."""
    calls = _calls()
    phases = tmp_path / "phases.jsonl"
    phases.write_text(json.dumps({"event": "status", "phase": "off"}) + "\n")
    config, _ = load_node_config(calls.node_config(tmp_path, phases, reflex_process=False))
    return config, calls.FixedTable(calls.fixed_table(4242))


def _counting_hand_overs(host: Any) -> list[Any]:
    """What is handed to the host's pool from now on."""
    pool = host._pool
    assert pool is not None
    submitted: list[Any] = []
    submit = pool.submit

    def counted(fn: Any, *args: Any, **kw: Any) -> Any:
        submitted.append(fn)
        return submit(fn, *args, **kw)

    pool.submit = counted
    return submitted


def test_a_tick_reads_every_source_in_one_hand_over(tmp_path: Path) -> None:
    config, fixed = _node(tmp_path)
    host = build_plugin_manager(config.plugins, config.disable_plugins, extra=[("fixed", fixed)])
    daemon = Daemon(config, tmp_path / "arbiter.yaml", host=host)
    try:
        daemon.ticker.once()  # the rule book loaded, the sources started
        daemon.decider.take(drained(daemon.decider.inbox) or [])
        submitted = _counting_hand_overs(host)
        daemon.ticker.once()
        sources = sum(len(live.sources()) for live in daemon.ticker.rules.live.values())
        assert sources >= 9
        # the table, the matchers, the GPU reader, two host signals, and the sources together
        assert len(submitted) <= 7, f"{len(submitted)} hand-overs for a tick with {sources} sources"
    finally:
        daemon.shutdown()


def test_a_tick_with_a_look_at_the_schedulers_due_hands_over_once(tmp_path: Path) -> None:
    config, fixed = _node(tmp_path)
    asked: list[Any] = []

    class Scheduler:
        @hookimpl
        def arbiter_scheduler_jobs(self, node_state: Any, context: Any) -> list[dict[str, Any]]:
            asked.append(node_state)
            return []  # nothing runs here for it

    host = build_plugin_manager(
        config.plugins, config.disable_plugins, extra=[("fixed", fixed), ("scheduler", Scheduler())]
    )
    daemon = Daemon(config, tmp_path / "arbiter.yaml", host=host)
    try:
        for _ in range(2):  # the rule book loaded, a decision taken and the node's state told
            daemon.ticker.once()
            daemon.decider.take(drained(daemon.decider.inbox) or [])
        submitted = _counting_hand_overs(host)
        daemon.reconciler._last = -daemon.reconciler.every_s  # a look at the schedulers is due
        before = len(asked)
        daemon.ticker.once()
        assert len(asked) == before + 1  # the schedulers were asked on this tick
        assert len(submitted) == 1, f"{len(submitted)} hand-overs for one idle tick"
    finally:
        daemon.shutdown()
