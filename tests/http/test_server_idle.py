"""The HTTP listener's thread sleeps while no request comes: uvicorn's housekeeping loop
holds no timer, a stop wakes it at once, and the Date header is still made afresh."""

from __future__ import annotations

import http.client
import threading
import time
from email.utils import parsedate_to_datetime
from typing import Any

import uvicorn

from arbiter.http.protocol import HeadTimeoutProtocol
from arbiter.http.server import _QuietServer
from arbiter_testing import wait_until


async def hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello"})


def date_of(port: int) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/")
        answer = conn.getresponse()
        assert answer.read() == b"hello"
        return parsedate_to_datetime(answer.headers["date"]).timestamp()
    finally:
        conn.close()


def test_an_idle_server_holds_no_timer_and_stops_at_once() -> None:
    config = uvicorn.Config(hello, host="127.0.0.1", port=0, log_level="warning", http=HeadTimeoutProtocol)
    server = _QuietServer(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, what="the server listening")
        port = server.servers[0].sockets[0].getsockname()[1]
        loop = wait_until(lambda: server._loop, what="the server's loop")
        # nothing scheduled: the loop sleeps in its selector until a request or a stop comes
        wait_until(lambda: not loop._scheduled, what="no timer left on the idle loop")  # type: ignore[attr-defined]

        first = date_of(port)
        assert abs(first - time.time()) < 2
        # a later second's request gets a later Date, though nothing woke the loop in between
        wait_until(lambda: int(time.time()) > int(first) + 1, timeout_s=5, what="two seconds on")
        assert date_of(port) >= first + 1
    finally:
        asked = time.monotonic()
        server.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert time.monotonic() - asked < 5  # woken, not left to find out on a timer
