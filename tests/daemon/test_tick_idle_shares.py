"""A rule whose processes' counters did not move since the last reading used no GPU time: the
tick says so without working out its share (a reader hands back the very same counters for
an idle process), and works it out for a rule one of whose processes ran."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from arbiter.config.loader import load_node_config
from arbiter.daemon import observe
from arbiter.daemon.core import Daemon
from arbiter.daemon.inbox import drained
from arbiter.engine.usage import busy_share
from arbiter.pluginmanager import build_plugin_manager
from arbiter_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
PROTECTED_PID = 4242


def test_an_idle_rule_reads_no_share_and_one_whose_process_ran_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = load_script(ROOT / "bench" / "costcalls.py", "costcalls")
    phases = tmp_path / "phases.jsonl"
    phases.write_text(json.dumps({"event": "status", "phase": "off"}) + "\n")
    config, _ = load_node_config(calls.node_config(tmp_path, phases, reflex_process=False))
    fixed = calls.FixedTable(calls.fixed_table(PROTECTED_PID))
    host = build_plugin_manager(config.plugins, config.disable_plugins, extra=[("fixed", fixed)])
    daemon = Daemon(config, tmp_path / "arbiter.yaml", host=host)
    worked_out: list[Any] = []
    share = busy_share

    def counted(*args: Any) -> float | None:
        worked_out.append(args[-1])
        return share(*args)

    def observed() -> Any:
        return daemon.ticker.observer.observe(daemon.ticker.rules, [], [])

    try:
        daemon.ticker.once()  # the rule book loaded, the sources started
        daemon.decider.take(drained(daemon.decider.inbox) or [])
        observed()
        monkeypatch.setattr(observe, "busy_share", counted)
        view = observed()
        assert view.rules["protected"].running and view.rules["protected"].gpu_share == 0.0
        assert worked_out == []
        at = next(i for i, p in enumerate(fixed.table) if p.pid == PROTECTED_PID)
        ran = fixed.table[at]
        fixed.table[at] = dataclasses.replace(ran, cpu_ns=(ran.cpu_ns or 0) + 10**9)  # a second's work
        view = observed()
        assert worked_out == [frozenset({PROTECTED_PID})]
        assert view.rules["protected"].gpu_share is not None and view.rules["protected"].gpu_share > 0
    finally:
        daemon.shutdown()
