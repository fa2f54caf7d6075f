"""The tick's process table follows the kernel's process events where the machine gives them,
and a protected program that starts is in the very next tick's view whether the event source
works, has died, or has gone deaf: the scan covers what the events miss."""

from __future__ import annotations

import json
import queue
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from arbiter.config.loader import load_node_config
from arbiter.daemon.core import Daemon
from arbiter.daemon.inbox import Inbox, Tick
from arbiter_testing.scripts import load_script
from arbiter_testing.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's process events are Linux's"),
    # the rule matches its program by command line across the host: one variant's program
    # would run in another's view, so one worker runs them in turn
    pytest.mark.xdist_group("cost-calls-protected"),
]


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    calls = load_script(ROOT / "bench" / "costcalls.py", "costcalls")
    phases = tmp_path / "phases.jsonl"
    phases.write_text(json.dumps({"event": "status", "phase": "off"}) + "\n")
    config, _ = load_node_config(calls.node_config(tmp_path, phases, reflex_process=False))
    daemon = Daemon(config, tmp_path / "arbiter.yaml")
    try:
        daemon.ticker.once()  # the rule book loaded, the table read once
        memo = next(iter(daemon.ticker.observer._table_scratch.values()))
        if not memo.events_in_use:
            pytest.skip(f"no process events here: {memo.events_why}")
        yield daemon
    finally:
        daemon.shutdown()


def waiting(inbox: Inbox[Any]) -> list[Any]:
    out = []
    while True:
        try:
            out.append(inbox.get_nowait())
        except queue.Empty:
            return out


def running_after_one_tick(daemon: Daemon) -> bool:
    waiting(daemon.decider.inbox)
    daemon.ticker.once()
    ticks = [m for m in waiting(daemon.decider.inbox) if isinstance(m, Tick)]
    return ticks[-1].view.rules["protected"].running


def protected_program() -> subprocess.Popen[bytes]:
    """The protected rule's program, once its command line is its own (after its exec)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "cost-calls-protected"])
    wait_until(lambda: b"cost-calls-protected" in Path(f"/proc/{proc.pid}/cmdline").read_bytes(), 10, "its exec")
    return proc


def events(daemon: Daemon) -> Any:
    return next(iter(daemon.ticker.observer._table_scratch.values()))._events


@pytest.mark.parametrize("source", ["working", "killed", "deaf"])
def test_a_protected_program_that_starts_is_in_the_next_ticks_view(daemon: Daemon, source: str) -> None:
    assert not running_after_one_tick(daemon)
    if source != "working":
        events(daemon)._sock.close()  # the event source dies under the table
    if source == "deaf":  # one that hears nothing, as in a network namespace of its own
        events(daemon)._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 11)
    proc = protected_program()
    try:
        assert running_after_one_tick(daemon)
    finally:
        proc.kill()
        proc.wait()
    assert not running_after_one_tick(daemon)


def test_doctor_is_told_how_the_table_is_read(daemon: Daemon) -> None:
    assert "the kernel's process events name what to read again" in daemon.ticker.observer.table_about
    events(daemon)._sock.close()
    daemon.ticker.once()
    about = daemon.ticker.observer.table_about
    assert about.startswith("a full scan on every read") and "process events failed" in about
