"""The decision thread, woken by a tick alone, lets the tick thread reach its wait before
taking it: woken first on the tick thread's core, it held the interpreter while the tick
thread, a few steps short of its wait, waited behind it, and the two handed it back and forth.
A batch with anything else in it is taken at once."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from arbiter.config.loader import load_node_config
from arbiter.daemon import decider as decider_module
from arbiter.daemon.core import Daemon
from arbiter.daemon.inbox import JobsChanged, Message
from arbiter.pluginmanager import build_plugin_manager
from arbiter_testing import wait_until
from arbiter_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def test_a_tick_waits_for_its_teller_to_sleep_and_a_change_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = load_script(ROOT / "bench" / "costcalls.py", "costcalls")
    phases = tmp_path / "phases.jsonl"
    phases.write_text(json.dumps({"event": "status", "phase": "off"}) + "\n")
    config, _ = load_node_config(calls.node_config(tmp_path, phases, reflex_process=False))
    fixed = calls.FixedTable(calls.fixed_table(4242))
    host = build_plugin_manager(config.plugins, config.disable_plugins, extra=[("fixed", fixed)])
    daemon = Daemon(config, tmp_path / "arbiter.yaml", host=host)
    seen: list[tuple[str, Any]] = []

    def sleep(seconds: float) -> None:
        seen.append(("sleep", seconds))
        time.sleep(seconds)

    monkeypatch.setattr(decider_module, "time", SimpleNamespace(**{**vars(time), "sleep": sleep}))
    take = daemon.decider.take

    def taking(batch: list[Message]) -> bool:
        seen.append(("take", [type(m).__name__ for m in batch]))
        return take(batch)

    monkeypatch.setattr(daemon.decider, "take", taking)
    switch = sys.getswitchinterval()
    thread = threading.Thread(target=daemon.decider.run, name="decide")
    thread.start()
    try:
        daemon.ticker.once()
        wait_until(lambda: len(seen) >= 2, what="the tick taken")
        daemon.decider.tell(JobsChanged())
        wait_until(lambda: len(seen) >= 3, what="the change taken")
    finally:
        daemon.decider.stop()
        thread.join(10)
        sys.setswitchinterval(switch)
        daemon.shutdown()
    assert seen == [
        ("sleep", decider_module.TICK_SETTLE_S),
        ("take", ["Tick"]),
        ("take", ["JobsChanged"]),
    ]
