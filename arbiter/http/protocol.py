"""The HTTP protocol the listener speaks: uvicorn's h11 one, with a deadline for each
request's head.

uvicorn closes a connection left idle after an answer, but not one that never sends a
request, or sends its head a byte at a time: any account could hold connections (and the
daemon's descriptors) open for ever.  Here a request's head must be complete within
:data:`HEAD_TIMEOUT_S` of the connection opening or of the last answer, or the connection
is closed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

#: seconds a connection may take to send a request's head (a local client needs milliseconds)
HEAD_TIMEOUT_S = 5.0
#: connections and requests served at once; more are answered 503 at once
MAX_CONCURRENCY = 256


class HeadTimeoutProtocol(H11Protocol):
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete:
            self._disarm()  # the head is in: how long the answer takes is the app's business

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._expire)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _expire(self) -> None:
        self._head_timer = None
        if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
            self.transport.close()
