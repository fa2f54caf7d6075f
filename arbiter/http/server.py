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

#: how often the HTTP server's housekeeping loop wakes (uvicorn's own wakes every 0.1 s)
HOUSEKEEPING_S = 1.0


class _QuietServer(uvicorn.Server):
    """uvicorn's server, whose housekeeping loop (the Date header, a stop asked for) wakes
    once a second instead of ten times: the Date header's resolution is a second anyway, and
    a stop waits a second at most."""

    async def main_loop(self) -> None:
        while not await self.on_tick(0):  # tick 0: the Date header is made afresh each time
            await asyncio.sleep(HOUSEKEEPING_S)


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
        self._server.should_exit = True
        self._thread.join(timeout=5)
