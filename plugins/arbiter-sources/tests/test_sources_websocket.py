"""``websocket``: any message is a wake-up handed to ``on_change``; reconnecting after
``retry_s`` doubling to ``max_retry_s``; and the wiring the daemon does (a wake-up refreshes
the tenant's busy probe) against the fake diffusion server."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

import pytest
from pydantic import ValidationError

from arbiter.plugin import PluginContext, SourceState
from arbiter_sources.http_count import HttpCountSource
from arbiter_sources.websocket import WebsocketSource, backoff
from arbiter_testing import GIB, FakeDiffusionServer, VramBoard, wait_until


def ws_source(tmp_path: Path, url: str, **options: object) -> WebsocketSource:
    opts = WebsocketSource.Options.model_validate({"kind": "websocket", "url": url, **options})
    return WebsocketSource(opts, PluginContext(state_dir=tmp_path))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Changes:
    """What on_change was handed, safe to read from the test thread."""

    def __init__(self) -> None:
        self.states: list[SourceState] = []
        self._lock = threading.Lock()

    def __call__(self, state: SourceState) -> None:
        with self._lock:
            self.states.append(state)

    def count(self) -> int:
        with self._lock:
            return len(self.states)


@pytest.fixture
def board(tmp_path: Path) -> VramBoard:
    return VramBoard(tmp_path / "gpu.json", 24 * GIB)


@pytest.fixture
def diffusion(board: VramBoard) -> Iterator[FakeDiffusionServer]:
    with FakeDiffusionServer(board, fast_s=0.05, starved_s=5.0) as server:
        yield server


def test_backoff_is_2_s_doubling_to_15_s() -> None:
    assert list(islice(backoff(2, 15), 6)) == [2, 4, 8, 15, 15, 15]
    options = WebsocketSource.Options.model_validate({"kind": "websocket", "url": "ws://127.0.0.1:1/ws"})
    assert (options.retry_s, options.max_retry_s) == (2, 15)


def test_options_are_checked() -> None:
    with pytest.raises(ValidationError, match="ws:// or wss://"):
        WebsocketSource.Options.model_validate({"kind": "websocket", "url": "ftp://127.0.0.1/ws"})
    assert WebsocketSource.Options.model_validate({"kind": "websocket", "url": "https://h/ws"}).url == "wss://h/ws"
    with pytest.raises(ValidationError, match="at least retry_s"):
        WebsocketSource.Options.model_validate(
            {"kind": "websocket", "url": "ws://x/ws", "retry_s": 5, "max_retry_s": 1}
        )


def test_every_message_is_a_wake_up(tmp_path: Path, diffusion: FakeDiffusionServer) -> None:
    changes = Changes()
    src = ws_source(tmp_path, diffusion.ws_url)
    src.start(changes)
    try:
        # connecting is a wake-up, and so is the status message the server sends on connect
        wait_until(lambda: src.state().count >= 1, 5, "the first message")
        assert changes.states[0].readable and changes.states[0].count == 0
        before = src.state().count
        diffusion.submit()
        wait_until(lambda: len(diffusion.runs) == 1, 10, "the run")
        wait_until(lambda: src.state().count >= before + 5, 5, "the run's messages")
    finally:
        src.close()  # no hand-over after this: the counts below are final
    counts = [s.count for s in changes.states]
    assert counts == sorted(counts) and all(s.readable for s in changes.states)
    assert changes.count() == src.state().count + 1  # one hand-over per message, plus the connect


def test_reconnects_after_the_server_drops_it(tmp_path: Path, diffusion: FakeDiffusionServer) -> None:
    changes = Changes()
    src = ws_source(tmp_path, diffusion.ws_url, retry_s=0.05, max_retry_s=0.2)
    src.start(changes)
    try:
        wait_until(lambda: src.connects == 1 and diffusion.ws_clients() == 1, 5, "the connection")
        diffusion.drop_websockets()
        wait_until(lambda: src.connects == 2, 5, "the reconnection")
        assert any(not s.readable and "trying again in 0.05s" in s.why for s in changes.states)
        assert src.waits == [0.05]
        assert changes.states[-1].readable or src.state().readable
    finally:
        src.close()


def test_waits_double_while_nobody_listens_and_start_over_once_connected(tmp_path: Path, board: VramBoard) -> None:
    port = free_port()
    src = ws_source(tmp_path, f"ws://127.0.0.1:{port}/ws", retry_s=0.02, max_retry_s=0.08)
    src.start(Changes())
    try:
        wait_until(lambda: len(src.waits) >= 5, 10, "five failed tries")
        assert src.waits[:5] == [0.02, 0.04, 0.08, 0.08, 0.08]
        assert not src.state().readable and "cannot connect" in src.state().why
        with FakeDiffusionServer(board, ws_port=port) as diffusion:
            wait_until(lambda: src.connects == 1 and diffusion.ws_clients() == 1, 5, "the connection once it listens")
            tries = len(src.waits)
            diffusion.drop_websockets()
            wait_until(lambda: src.connects == 2, 5, "the reconnection")
            assert src.waits[tries] == 0.02, "a connection that opened starts the waits over"
    finally:
        src.close()


def test_close_ends_it_while_connected_and_while_waiting(tmp_path: Path, diffusion: FakeDiffusionServer) -> None:
    connected = ws_source(tmp_path, diffusion.ws_url)
    connected.start(Changes())
    wait_until(lambda: connected.connects == 1, 5, "the connection")
    connected.close()
    assert connected._thread is not None and not connected._thread.is_alive()
    waiting = ws_source(tmp_path, f"ws://127.0.0.1:{free_port()}/ws", retry_s=600, max_retry_s=600)
    waiting.start(Changes())
    wait_until(lambda: len(waiting.waits) == 1, 5, "the first failed try")
    waiting.close()
    assert waiting._thread is not None and not waiting._thread.is_alive()


def test_a_wake_up_refreshes_the_busy_probe_at_once(tmp_path: Path, board: VramBoard) -> None:
    """The daemon's wiring: the events source's on_change calls the busy probe's refresh().
    The probe polls once an hour, so only the wake-up can make it see the new work."""
    board.set(9999, 23 * GIB)  # the run is starved: it stays in the queue while the test looks
    with FakeDiffusionServer(board, fast_s=0.05, starved_s=30) as diffusion:
        busy = HttpCountSource(
            HttpCountSource.Options.model_validate(
                {
                    "kind": "http_count",
                    "url": f"{diffusion.url}/queue",
                    "count_keys": ["queue_running", "queue_pending"],
                    "every_s": 3600,
                }
            ),
            PluginContext(state_dir=tmp_path),
        )
        events = ws_source(tmp_path, diffusion.ws_url)
        busy.start(lambda state: None)
        events.start(lambda state: busy.refresh())
        try:
            # the server's hello arrived, so it sends this client what follows
            wait_until(lambda: events.state().count >= 1 and busy.state().busy is False, 5, "both reading")
            diffusion.submit()
            wait_until(lambda: busy.state().busy is True, 5, "the woken probe to see the queue")
            board.set(9999, 0)
            wait_until(lambda: busy.state().busy is False, 10, "the queue to empty, seen through a wake-up")
        finally:
            events.close()
            busy.close()
    board.remove(9999)


def test_it_does_not_try_while_its_program_does_not_run_and_connects_once_it_does(
    tmp_path: Path, board: VramBoard
) -> None:
    """Told its program does not run, it rests before any try (nothing listens: a quiet node
    would wake every wait for nothing) and says why; told it runs, it connects at once, not
    after its wait; told so while connected, it keeps the connection while it lasts."""
    changes = Changes()
    src = ws_source(tmp_path, f"ws://127.0.0.1:{free_port()}/ws", retry_s=600, max_retry_s=600)
    port = int(src.options.url.rsplit(":", 1)[1].split("/")[0])
    src.tenant_running(False)
    src.start(changes)
    try:
        wait_until(lambda: changes.count() >= 1, 5, "it says why it does not connect")
        assert "its program does not run" in changes.states[-1].why and not src.state().readable
        assert src.waits == [] and src.connects == 0  # not one try
        with FakeDiffusionServer(board, ws_port=port) as diffusion:
            src.tenant_running(True)  # its program started: connects now, not in 600 s
            wait_until(lambda: src.connects == 1 and diffusion.ws_clients() == 1, 5, "the connection at once")
            src.tenant_running(False)
            src.tenant_running(True)
            assert src.connects == 1 and src.waits == []
    finally:
        src.close()
    assert src._thread is not None and not src._thread.is_alive()
