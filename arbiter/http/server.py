"""Serving the app with uvicorn on a thread of the daemon."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import uvicorn

from arbiter.daemon.views import duty_view, explain_view, status_view
from arbiter.http.app import create_app

if TYPE_CHECKING:
    from arbiter.daemon.core import Daemon


class DaemonProvider:
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.token = daemon.token

    def status(self) -> dict[str, Any]:
        return status_view(self.daemon)

    def explain(self, subject: str | None) -> dict[str, Any]:
        return explain_view(self.daemon, subject)

    def timeline(self, limit: int, subject: str | None, code: str | None) -> list[dict[str, Any]]:
        return self.daemon.store.timeline(limit, subject, code)

    def reload(self) -> None:
        self.daemon.request_reload()

    def gpu_apis(self) -> dict[str, Any]:
        return self.daemon.prober.get() or {"pending": True, "host": [], "containers": [], "evidence": {}}

    def duty(self) -> dict[str, Any]:
        return duty_view(self.daemon)

    def ab_runs(self) -> list[dict[str, Any]]:
        from arbiter.daemon.abruns import status

        return status(self.daemon)

    def ab_report(self, run_id: str) -> dict[str, Any]:
        from arbiter.daemon.abruns import RunRefused, find
        from arbiter.harness.report import report

        try:
            return report(*find(self.daemon, run_id))
        except RunRefused as exc:
            raise LookupError(str(exc)) from None


class HttpServer:
    def __init__(self, daemon: Daemon, host: str, port: int) -> None:
        config = uvicorn.Config(create_app(DaemonProvider(daemon)), host=host, port=port, log_level="warning", access_log=False)
        self._server = uvicorn.Server(config)
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
