"""A rule's ``events:`` source is told on the tick whether its program runs, as its busy
probe is: one that connects to the program (a websocket) makes no tries while nothing
listens, so a quiet node does not wake for them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from arbiter.config.loader import load_node_config
from arbiter.daemon.core import Daemon
from arbiter.plugin import Source
from arbiter.pluginmanager import build_plugin_manager
from arbiter_testing import wait_until
from arbiter_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def _resting(source: Source) -> Callable[[], bool]:
    return lambda: "its program does not run" in source.state().why


def test_an_events_source_whose_program_does_not_run_is_told_so_and_rests(tmp_path: Path) -> None:
    calls = load_script(ROOT / "bench" / "costcalls.py", "costcalls")
    phases = tmp_path / "phases.jsonl"
    phases.write_text(json.dumps({"event": "status", "phase": "off"}) + "\n")
    config, _ = load_node_config(calls.node_config(tmp_path, phases, reflex_process=False))
    fixed = calls.FixedTable(calls.fixed_table(4242))  # none of the shipped rules' programs runs
    host = build_plugin_manager(config.plugins, config.disable_plugins, extra=[("fixed", fixed)])
    daemon = Daemon(config, tmp_path / "arbiter.yaml", host=host)
    try:
        daemon.ticker.once()
        told = {rid: live.events for rid, live in daemon.ticker.rules.live.items() if live.events is not None}
        assert told, "the shipped rules have an events source"
        for rid, source in told.items():
            assert source is not None
            wait_until(_resting(source), 10, f"{rid}'s events source to rest")
    finally:
        daemon.shutdown()
