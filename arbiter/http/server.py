"""Serving the app with uvicorn on a thread of the daemon."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING

import uvicorn

from arbiter.http.app import create_app
from arbiter.http.guard import warn_if_reachable
from arbiter.http.protocol import MAX_CONCURRENCY, HeadTimeoutProtocol

if TYPE_CHECKING:
    from arbiter.http.provider import Provider


class _QuietServer(uvicorn.Server):
    """uvicorn's server, whose housekeeping loop (the Date header, a stop asked for) sleeps
    until a stop is asked for, instead of waking ten times a second: an idle daemon's HTTP
    thread does not wake at all.  The Date header is made as each request arrives
    (:class:`~arbiter.http.protocol.HeadTimeoutProtocol`)."""

    _loop: asyncio.AbstractEventLoop | None = None
    _stop: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self._stop = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        while not await self.on_tick(0):  # tick 0: the Date header is made afresh each time
            await self._stop.wait()
            self._stop.clear()

    def stop(self) -> None:
        """Ask the server to stop, from any thread, waking its loop."""
        self.should_exit = True
        loop, event = self._loop, self._stop
        if loop is not None and event is not None:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:
                pass  # its loop has closed: it has stopped already


class HttpServer:
    def __init__(self, provider: Provider, host: str, port: int) -> None:
        warn_if_reachable(host, port)
        app = create_app(provider, bind_host=host)
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            http=HeadTimeoutProtocol,
            limit_concurrency=MAX_CONCURRENCY,
        )
        self._server = _QuietServer(config)
        self._thread = threading.Thread(target=self._server.run, name="http", daemon=True)
        self.host = host

    def start(self, timeout: float = 10.0) -> str:
        """Start listening; returns the URL (the real port when 0 was asked)."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"could not listen on {self.host}")
            time.sleep(0.01)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self._server.stop()
        self._thread.join(timeout=5)
