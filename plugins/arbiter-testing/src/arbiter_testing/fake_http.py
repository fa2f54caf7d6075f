"""The HTTP serving every fake program shares: a JSON server on 127.0.0.1 on its own thread,
a record of each request it received (:class:`Seen`), and :class:`RecordingServer`, which
answers every request with a scripted status and records it.

A fake program is a :class:`FakeApp` with ``routes``: ``(method, path)`` to a function of the
request's JSON body that returns ``(status, answer)``; ``(method, "*")`` answers any path.
With ``api_key`` set, a request to any path but ``open_paths`` without the header
``Authorization: Bearer KEY`` is answered 401, as the servers started with an API key do.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOST = "127.0.0.1"
#: the share of GPU time a fake reports while it works (the fake reader integrates it)
WORKING_SHARE = 0.9


def now_iso() -> str:
    """Now, as the local-time ISO 8601 timestamps the real servers answer with."""
    return datetime.now(UTC).astimezone().isoformat()


Route = Callable[[dict[str, Any] | None], tuple[int, Any]]


class _Handler(BaseHTTPRequestHandler):
    server: _JsonHttpServer
    protocol_version = "HTTP/1.1"  # keep-alive: a client's next request reuses the connection

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests read what they need from the fake itself, not from stderr

    def _serve(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                self._reply(400, {"error": "invalid JSON body"})
                return
        app = self.server.app
        app.record(method, self.path, dict(self.headers), body)
        if app.api_key and path not in app.open_paths and self.headers.get("Authorization") != f"Bearer {app.api_key}":
            self._reply(401, {"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}})
            return
        route = self.server.app.routes.get((method, path))
        if route is None:
            route = self.server.app.routes.get((method, "*"))
        if route is None:
            self._reply(404, {"error": f"no route {method} {path}"})
            return
        status, answer = route(body)
        self._reply(status, answer)

    def _reply(self, status: int, answer: Any) -> None:
        if isinstance(answer, bytes):
            data, ctype = answer, "text/plain; charset=utf-8"
        elif answer is None:
            data, ctype = b"", "text/plain; charset=utf-8"
        else:
            data, ctype = json.dumps(answer).encode(), "application/json; charset=utf-8"
        # a client past its deadline (a probe that timed out) leaves before the answer, as
        # tests make it do; that is its choice, not the server's failure
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")


class _JsonHttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, app: FakeApp, port: int = 0) -> None:
        self.app = app
        super().__init__((HOST, port), _Handler)


@dataclass(frozen=True)
class Seen:
    """One request a fake received."""

    at: float  # monotonic
    method: str
    path: str
    headers: Mapping[str, str]
    body: Any


class FakeApp:
    """What every fake shares: its HTTP server on its own thread and a record of requests."""

    def __init__(self, port: int = 0) -> None:
        self.routes: dict[tuple[str, str], Route] = {}
        #: the key a request must carry as ``Authorization: Bearer KEY`` ("" for none), and
        #: the paths answered without it
        self.api_key = ""
        self.open_paths: frozenset[str] = frozenset({"/health"})
        self.seen: list[Seen] = []
        self._seen_lock = threading.Lock()
        self._http = _JsonHttpServer(self, port)
        # a short poll: stopping a fake (shutdown waits for it) stays quick
        self._http_thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.02}, name=f"fake-http:{self.port}", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._http.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def record(self, method: str, path: str, headers: dict[str, str], body: Any) -> None:
        with self._seen_lock:
            self.seen.append(Seen(time.monotonic(), method, path, headers, body))

    def requests(self, method: str | None = None, path: str | None = None) -> list[Seen]:
        with self._seen_lock:
            return [s for s in self.seen if (method is None or s.method == method) and (path is None or s.path == path)]

    def start(self) -> FakeApp:
        self._http_thread.start()
        return self

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._http_thread.join(timeout=5)

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RecordingServer(FakeApp):
    """Answers every request with ``status`` and ``answer`` (after ``delay_s``), recording each."""

    def __init__(self, status: int = 200, answer: Any = None, delay_s: float = 0.0, port: int = 0) -> None:
        super().__init__(port)
        self.status = status
        self.answer = answer
        self.delay_s = delay_s
        for method in ("GET", "POST", "PUT", "PATCH"):
            self.routes[(method, "*")] = self._any

    def _any(self, body: dict[str, Any] | None) -> tuple[int, Any]:
        if self.delay_s:
            time.sleep(self.delay_s)  # a slow program, for timeout tests
        return self.status, self.answer
