"""Before a release that a busy server cannot take, the daemon reads the server's busy probe
again; a read that was already under way when the server got its request does not stand for
that reading (it would say idle, and the release would break the server)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pluggy
import pytest

from arbiter.config.models import NodeConfig
from arbiter.daemon.handoff import TenantActions
from arbiter.plugin import PluginContext, SourceState
from arbiter.pluginmanager import PluginHost
from arbiter_sources.http_value import PrometheusSource
from arbiter_testing.waiting import wait_until


class Server:
    """A /metrics page whose gauge is read when a request arrives; one request may be held
    before it is answered (a scrape under way), and those after it are slow."""

    def __init__(self) -> None:
        self.running = 0
        self.hold = False
        self.held = threading.Event()  # a held request has read the gauge and waits
        self.gate = threading.Event()
        self.scrapes = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                value = server.running
                server.scrapes += 1
                if server.hold:
                    server.hold = False
                    server.held.set()
                    server.gate.wait(10)
                elif server.gate.is_set():
                    time.sleep(0.3)  # the scrapes after it take a while (a server at work)
                body = f"# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs {value}\n".encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.gate.set()
    s.httpd.shutdown()


def test_a_read_under_way_when_the_server_got_work_does_not_let_the_release_go(server: Server, tmp_path: Path) -> None:
    options = PrometheusSource.Options.model_validate(
        {"kind": "prometheus", "url": server.url, "metrics": ["sglang:num_running_reqs"], "every_s": 600}
    )
    probe = PrometheusSource(options, PluginContext(state_dir=tmp_path))
    probe.start(lambda state: None)
    try:
        wait_until(lambda: probe.state().busy is False, what="the probe reads idle")
        # a scrape begins and reads the gauge at 0; then a request arrives and runs
        server.hold = True
        probe.refresh()
        assert server.held.wait(10)
        server.running = 1

        def wake_busy(_host: object) -> None:
            probe.refresh()
            server.gate.set()  # the scrape under way answers, with what it read before

        assert busy_now(probe, wake_busy)
        assert server.scrapes == 3  # at start, the one under way, and one begun after the ask
    finally:
        probe.close()


class Probe:
    """A busy probe that reads idle, each state as given."""

    def __init__(self, read_at: Any) -> None:
        self.read_at = read_at
        self.options = SimpleNamespace(timeout_s=0.2)

    def state(self) -> SourceState:
        return SourceState(busy=False, read_at=self.read_at() if callable(self.read_at) else self.read_at)


def busy_now(probe: Any, wake_busy: Any = lambda _host: None) -> bool:
    """What the daemon's look at ``probe`` right before a release says: busy?"""
    host = PluginHost(pm=pluggy.PluginManager("arbiter"))
    live = SimpleNamespace(busy=probe, rule=SimpleNamespace(busy=SimpleNamespace(kind="probe")))
    live.wake_busy = wake_busy
    actions = TenantActions(
        NodeConfig(),
        host,
        store=None,  # type: ignore[arg-type]
        rulebook=None,  # type: ignore[arg-type]
        recorder=SimpleNamespace(event=None),  # type: ignore[arg-type]
        release_over=lambda rel, failed: None,
    )
    try:
        return actions._busy_now(live)
    finally:
        host.close()


def test_a_reading_dated_in_wall_time_is_garbage_not_fresh() -> None:
    assert busy_now(Probe(time.time))  # unknown, so busy: never a release on it


def test_a_dated_probe_that_does_not_read_again_in_twice_its_timeout_counts_as_busy() -> None:
    began = time.monotonic()
    assert busy_now(Probe(began - 10))
    assert 0.9 <= time.monotonic() - began < 5  # 2 x 0.2 s and half a second


def test_a_dated_probe_that_reads_again_idle_lets_the_release_go() -> None:
    assert not busy_now(Probe(time.monotonic))
