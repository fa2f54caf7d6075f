"""Building a daemon takes the state directory; one that never starts, or fails to build,
lets it go again with nothing left open or running."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from arbiter.config.loader import load_node_config
from arbiter.daemon import core
from arbiter.daemon.core import Daemon, DaemonAlreadyRunning
from arbiter_testing.node import HarnessNode
from arbiter_testing.rules import phase_rule
from arbiter_testing.waiting import wait_until


def built(tmp_path: Path) -> tuple[HarnessNode, Path]:
    events = tmp_path / "phase.jsonl"
    events.touch()
    node = HarnessNode(tmp_path)
    node.add_rule(
        "p",
        phase_rule("p", "sleep 4242", events, event="s", scope="all"),
    )
    return node, events


def watchers() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("arbiter-jsonl")]


def test_a_daemon_built_and_never_started_lets_the_state_dir_go(tmp_path: Path) -> None:
    node, _ = built(tmp_path)
    config, _ = load_node_config(node.config_path)
    daemon = Daemon(config, node.config_path)
    assert watchers(), "the rule's source watches from the moment the rule book is loaded"
    with pytest.raises(DaemonAlreadyRunning):
        Daemon(config, node.config_path)
    done = threading.Event()

    def shut_down() -> None:
        daemon.shutdown()
        done.set()

    threading.Thread(target=shut_down, daemon=True).start()
    assert done.wait(10), "shutdown of a daemon that never started must not wait for threads that never ran"
    wait_until(lambda: not watchers(), 10, "the source watcher to end")
    Daemon(config, node.config_path).shutdown()  # the lock was released


def test_a_daemon_that_fails_to_build_closes_what_it_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node, _ = built(tmp_path)
    config, _ = load_node_config(node.config_path)

    def fails(*_args: object) -> None:
        raise RuntimeError("the last step of building failed")

    with monkeypatch.context() as m:
        m.setattr(core, "Helpers", fails)  # after the rule book's sources started watching
        with pytest.raises(RuntimeError, match="last step"):
            Daemon(config, node.config_path)
    wait_until(lambda: not watchers(), 10, "the source watcher to end")
    Daemon(config, node.config_path).shutdown()  # the lock was released, the database closed
