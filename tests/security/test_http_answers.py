"""A local program answering the daemon is not trusted: an answer of any size, or one that
trickles in forever, costs a plugin no more than its byte cap and its deadline, and what is
quoted of an answer is short and printable."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from arbiter.plugin import PluginContext, quote
from arbiter_sources.http_count import MAX_ANSWER_BYTES, HttpCountSource
from arbiter_translators.http import HttpPostTranslator


class HostileServer:
    """A real HTTP server on 127.0.0.1 whose every answer is 200 with a body that never ends
    (``mode="endless"``, as fast as it is read, no length declared), a declared length of
    400 MB (``"declared"``), or a byte every 0.1 s (``"trickle"``); counts what it sent."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sent = 0
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen()
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/queue"
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            length = "Content-Length: 400000000\r\n" if self.mode == "declared" else "Connection: close\r\n"
            try:
                conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{length}\r\n".encode())
                chunk = b"[" + b"0," * 32767 if self.mode != "trickle" else b" "
                while not self._stop.is_set() and self.sent < 1 << 30:
                    conn.sendall(chunk)
                    self.sent += len(chunk)
                    if self.mode == "trickle":
                        time.sleep(0.1)
            except OSError:
                return

    def close(self) -> None:
        self._stop.set()
        self._listener.close()


def kernel_buffers() -> int:
    """The most a loopback connection's socket buffers hold beyond what its reader took (the
    receive side's and the send side's largest sizes): the server counts those bytes sent."""
    try:
        rmem = int(Path("/proc/sys/net/ipv4/tcp_rmem").read_text().split()[2])
        wmem = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    except (OSError, ValueError, IndexError):
        return 8 << 20
    return max(rmem + wmem, 8 << 20)


@pytest.fixture(params=["endless", "declared", "trickle"])
def hostile(request: pytest.FixtureRequest) -> Iterator[HostileServer]:
    server = HostileServer(request.param)
    yield server
    server.close()


def test_http_count_reads_no_more_than_its_cap_and_deadline(tmp_path: Path, hostile: HostileServer) -> None:
    opts = HttpCountSource.Options.model_validate(
        {"kind": "http_count", "url": hostile.url, "count_keys": ["queue"], "timeout_s": 1.0}
    )
    source = HttpCountSource(opts, PluginContext(state_dir=tmp_path))
    started = time.monotonic()
    with httpx.Client(timeout=1.0, trust_env=False) as client:
        state = source.probe_once(client)
    took = time.monotonic() - started
    assert not state.readable and state.busy is None  # unknown: counted as busy
    assert "not a status document" in state.why, state.why
    assert took < 1.0 + 1.0 + 1.0, f"the probe took {took:.1f}s"  # its deadline, one read's timeout, slack
    # an endless read for the deadline would take a gigabyte: what is allowed is the cap and
    # what the kernel buffered unread
    allowed = MAX_ANSWER_BYTES + kernel_buffers()
    assert hostile.sent < allowed, f"the server got {hostile.sent} bytes out (allowed {allowed})"


def test_a_release_answered_without_end_is_cut_and_quoted_short(tmp_path: Path, hostile: HostileServer) -> None:
    opts = HttpPostTranslator.Options.model_validate({"kind": "http_post", "url": hostile.url, "timeout_s": 1.0})
    translator = HttpPostTranslator(opts, PluginContext(state_dir=tmp_path))
    try:
        result = translator.release("t")
    finally:
        translator.close()
    assert result.errors and all(len(e) < 400 for e in result.errors), result.errors
    assert hostile.sent < (1 << 20) + kernel_buffers()  # its cap, and what the kernel buffered unread


def test_a_quote_is_short_and_printable() -> None:
    assert quote("a\x1b[31mred\x1b]8;;https://evil.example\x07link\n" + "x" * 500).startswith("a [31mred ]8;;https")
    assert len(quote("y" * 500)) == 80 and quote("  two\n\nlines ") == "two lines"
