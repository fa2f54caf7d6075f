"""``websocket``: a tenant's event stream, used only as a wake-up.

Any message (text or binary, whatever it says) means "something changed": the source calls
``on_change`` and the daemon re-probes that tenant at once, instead of at its next poll.  So a
tenant's busy probe stays the one judge of its state; the messages are never parsed.

The connection is kept open on the source's own thread and, when it drops or cannot be made,
tried again after ``retry_s`` (2 s), doubling up to ``max_retry_s`` (15 s); a connection that
opens starts the wait over.  Connecting is a wake-up too: what changed while it was down was
not seen.  While the daemon says its program does not run (``tenant_running``) it does not
try: nothing listens, and a quiet node would wake every 15 s for nothing; told it runs, it
connects at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from arbiter.plugin import KindOptions, PluginContext, Source, SourceState

log = logging.getLogger(__name__)

#: a bigger message (a preview image, say) is still a wake-up, but not one worth buffering
MAX_MESSAGE_BYTES = 64 << 20


class WebsocketOptions(KindOptions):
    """``{kind: websocket, url}``: any message wakes the tenant's busy probe."""

    def gives_phase(self) -> bool:
        return False

    kind: Literal["websocket"] = "websocket"
    url: str = Field(
        description=(
            "the ws:// or wss:// URL, e.g. ws://127.0.0.1:8188/ws; an http:// or https:// one (a path taken "
            "from the rule's base_url) is connected as ws:// or wss://"
        )
    )
    retry_s: float = Field(2.0, gt=0, le=600, description="first wait before connecting again")
    max_retry_s: float = Field(15.0, gt=0, le=3600, description="the wait doubles up to this")
    open_timeout_s: float = Field(5.0, gt=0, le=60, description="a connection not open by then failed")

    @field_validator("url")
    @classmethod
    def _ws(cls, value: str) -> str:
        if value.startswith(("http://", "https://")):
            return "ws" + value[len("http") :]  # the same server's websocket endpoint
        if not value.startswith(("ws://", "wss://")):
            raise ValueError(f"url must start with ws:// or wss:// (got {value!r})")
        return value

    @model_validator(mode="after")
    def _order(self) -> WebsocketOptions:
        if self.max_retry_s < self.retry_s:
            raise ValueError(f"max_retry_s ({self.max_retry_s:g}) must be at least retry_s ({self.retry_s:g})")
        return self


def backoff(first: float, cap: float) -> Iterator[float]:
    """The waits between tries: ``first``, doubling, never above ``cap``."""
    wait = first
    while True:
        yield min(wait, cap)
        wait = min(wait * 2, cap)


class WebsocketSource(Source):
    """``count`` is the number of messages received; ``readable`` says it is connected now."""

    Options = WebsocketOptions

    def __init__(self, options: WebsocketOptions, context: PluginContext) -> None:
        super().__init__(options, context)
        self.options: WebsocketOptions = options
        self._state = SourceState(readable=False, why=f"not connected to {options.url} yet")
        self._stop = threading.Event()
        self._wake = threading.Event()  # ends a wait: its program runs now, or a stop
        self._running = True  # whether its program runs, as the daemon last said (until told: it may)
        self._thread: threading.Thread | None = None
        self._on_change: Callable[[SourceState], None] | None = None
        self._conn: Any = None
        self._conn_lock = threading.Lock()
        self._session_opened = False
        self.connects = 0  # connections opened so far
        self.waits: list[float] = []  # every wait before trying again, in order (tests read it)

    def start(self, on_change: Callable[[SourceState], None]) -> None:
        self._on_change = on_change
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name=f"arbiter-websocket:{self.options.url}", daemon=True
            )
            self._thread.start()

    def state(self) -> SourceState:
        return self._state

    def tenant_running(self, running: bool) -> None:
        self._running = running
        if running:
            self._wake.set()  # connect now, not after the wait under way

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        with self._conn_lock:
            conn = self._conn
        if conn is not None:
            try:
                conn.close()  # wakes the thread's recv
            except Exception:
                log.debug("websocket %s: close failed", self.options.url, exc_info=True)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.options.open_timeout_s + 3)

    def _hand_over(self, state: SourceState) -> None:
        self._state = state
        if self._on_change is not None:
            try:
                self._on_change(state)
            except Exception:
                log.exception("websocket source %s: on_change failed", self.options.url)

    def _loop(self) -> None:
        waits = backoff(self.options.retry_s, self.options.max_retry_s)
        while not self._stop.is_set():
            if not self._running:
                self._hand_over(
                    SourceState(
                        readable=False,
                        count=self._state.count,
                        why=f"not connected to {self.options.url}: its program does not run",
                        changed_at=time.monotonic(),
                    )
                )
                while not self._running and not self._stop.is_set():
                    self._wake.wait()  # until told it runs (or to stop)
                    self._wake.clear()
                waits = backoff(self.options.retry_s, self.options.max_retry_s)  # a program started: start over
                continue
            self._wake.clear()  # a wake-up before this try is answered by it
            why = self._session()
            if self._session_opened:
                waits = backoff(self.options.retry_s, self.options.max_retry_s)  # it worked: start over
            if self._stop.is_set():
                break
            wait = next(waits)
            self.waits.append(wait)
            self._hand_over(
                SourceState(
                    readable=False,
                    count=self._state.count,
                    why=f"{why}; trying again in {wait:g}s",
                    changed_at=time.monotonic(),
                )
            )
            self._wake.wait(wait)

    def _session(self) -> str:
        """One connection, kept until it drops; returns why it ended."""
        # here: a process with no websocket source does not carry the library (it is large)
        from websockets.exceptions import InvalidHandshake, InvalidURI, WebSocketException
        from websockets.sync.client import connect

        url = self.options.url
        self._session_opened = False
        try:
            # proxy off: a tenant on this host is never reached through a proxy from the environment
            with connect(
                url,
                open_timeout=self.options.open_timeout_s,
                close_timeout=1,
                proxy=None,
                max_size=MAX_MESSAGE_BYTES,
                compression=None,
            ) as conn:
                return self._listen(conn)
        except (OSError, TimeoutError) as exc:
            return f"cannot connect to {url}: {getattr(exc, 'strerror', None) or exc}; is the program running?"
        except InvalidURI as exc:
            return f"{url} is not a websocket URL: {exc}"
        except InvalidHandshake as exc:
            return f"{url} refused the websocket: {exc}; check the path"
        except WebSocketException as exc:
            return f"websocket to {url} failed: {exc}"

    def _listen(self, conn: Any) -> str:
        """Hand over a wake-up per message until the connection ends; returns why it ended."""
        from websockets.exceptions import ConnectionClosed, WebSocketException

        url = self.options.url
        with self._conn_lock:
            self._conn = conn
        try:
            if self._stop.is_set():
                return "closed"
            self._session_opened = True
            self.connects += 1
            self._hand_over(
                SourceState(readable=True, count=self._state.count, why="connected", changed_at=time.monotonic())
            )
            while not self._stop.is_set():
                try:
                    conn.recv(decode=False)  # never read, so never decoded
                except ConnectionClosed as exc:
                    return f"{url} closed the connection ({exc})"
                except (OSError, WebSocketException) as exc:
                    return f"the connection to {url} failed: {exc}"
                # any message is only a wake-up: the busy probe reads what it means
                self._hand_over(
                    SourceState(
                        readable=True, count=self._state.count + 1, why="connected", changed_at=time.monotonic()
                    )
                )
            return "closed"
        finally:
            with self._conn_lock:
                self._conn = None
