"""The HTTP protocol the listener speaks: uvicorn's h11 one, with a deadline for each
request's head, and the Date header made as each request arrives.

uvicorn closes a connection left idle after an answer, but not one that never sends a
request, or sends its head a byte at a time: any account could hold connections (and the
daemon's descriptors) open for ever.  Here a request's head must be complete within
:data:`HEAD_TIMEOUT_S` of the connection opening or of the last answer, or the connection
is closed.

uvicorn's housekeeping loop makes the Date header once a second; the daemon's sleeps until
a stop (an idle daemon's HTTP thread does not wake), so the header is made here instead,
when a request's head arrives, at most once a second.
"""

from __future__ import annotations

import asyncio
import time
from email.utils import formatdate
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
        self._date_header()
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete:
            self._disarm()  # the head is in: how long the answer takes is the app's business

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _date_header(self) -> None:
        """The server's default headers with the Date of this second (uvicorn's own loop,
        which made it, no longer wakes to)."""
        state, now = self.server_state, int(time.time())
        if getattr(state, "date_second", None) == now:
            return
        date = [(b"date", formatdate(now, usegmt=True).encode())] if self.config.date_header else []
        state.default_headers = date + self.config.encoded_headers
        state.date_second = now  # type: ignore[attr-defined]

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
