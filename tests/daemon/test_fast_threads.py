"""Each fast-path thread asks the host for a core sooner (``arbiter_fast_thread``), on that
thread: the decision thread as it starts, a phase source of an immediate rule on
its watcher at its first report; status says what each got, and a plugin that fails there
costs the fast path nothing."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import psutil

from arbiter.config.loader import load_node_config
from arbiter.daemon.core import Daemon
from arbiter.plugin import hookimpl
from arbiter.pluginmanager import build_plugin_manager
from arbiter_testing.node import HarnessNode


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.asked: list[tuple[str, str]] = []  # (role, the asking thread's name)

    @hookimpl
    def arbiter_fast_thread(self, role: str) -> str | None:
        self.asked.append((role, threading.current_thread().name))
        if self.fail:
            raise RuntimeError("no scheduler here")
        return f"noted {role}"


def run_with(tmp_path: Path, plugin: Recorder) -> dict[str, str]:
    """A daemon with an immediate rule (a JSONL phase) and a rule that is not; a phase turned
    on, and its job seen paused: status' fast_path.threads."""
    events, other = tmp_path / "phase.jsonl", tmp_path / "other.jsonl"
    events.touch()
    other.touch()
    # the daemon's own watcher: the reflex process, which has its own (tests/e2e/test_reflex_process.py),
    # does not load a plugin given to this daemon only
    node = HarnessNode(tmp_path, tick_s=0.2, reflex_process=False)
    source = {"kind": "jsonl", "event": "status", "field": "phase", "on": ["on"]}
    node.add_rule(
        "p",
        {
            "id": "p",
            "match": {"cmdline": ["sleep 1071"]},
            "immediate": True,
            "during": [{"source": {**source, "path": str(events)}, "pause_fleet": {"scope": "all"}}],
        },
    )
    node.add_rule(
        "q",
        {
            "id": "q",
            "match": {"cmdline": ["sleep 1072"]},
            "during": [{"source": {**source, "path": str(other)}, "pause_fleet": {"scope": "all"}}],
        },
    )
    config, _ = load_node_config(node.config_path)
    host = build_plugin_manager(config.plugins, config.disable_plugins, extra=[("recorder", plugin)])
    daemon = Daemon(config, node.config_path, host=host)
    daemon.start()
    try:
        node.spawn(["sleep", "1071"])
        node.spawn(["sleep", "1072"])
        node.job_run(["sleep", "3071"], "--name", "j")
        pid = node.job_pid("j", timeout=30)
        node.wait_for(
            lambda: (
                daemon.parts.snapshot.obs is not None
                and daemon.parts.snapshot.obs.rules["p"].running
                and daemon.parts.snapshot.obs.rules["q"].running
            ),
            timeout=30,
        )
        for path in (other, events):
            with open(path, "a") as fh:
                fh.write(json.dumps({"event": "status", "phase": "on"}) + "\n")
        node.wait_for(lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED, timeout=10)
        node.wait_for(lambda: "source p/during.0" in node.status()["fast_path"]["threads"], timeout=10)
        # q's watcher has reported its phase too (and was not hinted: q is not immediate)
        node.wait_for(lambda: node.known_rule("q")["sources"][0]["phase"] == "on", timeout=10)
        threads: dict[str, str] = node.status()["fast_path"]["threads"]
        return threads
    finally:
        daemon.shutdown()
        node.close()


def test_each_fast_path_thread_asks_once_on_itself_and_status_says_what_it_got(tmp_path: Path) -> None:
    plugin = Recorder()
    threads = run_with(tmp_path, plugin)
    roles = dict(plugin.asked)
    assert roles["decide"] == "decide"
    assert roles["source p/during.0"].startswith("arbiter-jsonl:")  # the watcher's own thread
    assert "source q/during.0" not in roles  # a rule that is not immediate waits for the tick anyway
    assert len(plugin.asked) == len(roles)  # once each
    assert threads["source p/during.0"].startswith("noted source p/during.0")
    assert threads["decide"].startswith("noted decide")


def test_a_plugin_that_fails_there_is_named_and_the_phase_still_pauses(tmp_path: Path) -> None:
    threads = run_with(tmp_path, Recorder(fail=True))  # run_with saw the job stopped
    assert threads["source p/during.0"] == "a plugin failed: RuntimeError: no scheduler here"
