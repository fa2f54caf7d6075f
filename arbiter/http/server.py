"""Serving the app with uvicorn on a thread of the daemon."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING, Any

import uvicorn

from arbiter.daemon.views import duty_view, explain_view, status_view
from arbiter.http.app import create_app
from arbiter.http.guard import warn_if_reachable
from arbiter.http.protocol import MAX_CONCURRENCY, HeadTimeoutProtocol

if TYPE_CHECKING:
    from arbiter.daemon.facade import Node


PLOT_TIMEOUT_S = 60.0
#: how often the HTTP server's housekeeping loop wakes (uvicorn's own wakes every 0.1 s)
HOUSEKEEPING_S = 1.0


class DaemonProvider:
    def __init__(self, daemon: Node) -> None:
        self.daemon = daemon
        self.token = daemon.token
        self._plots: dict[str, tuple[str, bytes]] = {}  # run id → (what it showed, its PNG)

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

    def metrics(self) -> dict[str, Any]:
        d = self.daemon
        return {
            "status": status_view(d),
            "duty": duty_view(d),
            "gpu_apis": d.prober.answer,
            "events": dict(d.recorder.counts),
            "latency": d.sources.histograms(),
            "costs": dict(d.costs),
        }

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

    def ab_plot(self, run_id: str) -> bytes:
        """Drawn in a child process (matplotlib would hold the GIL from the fast path), and
        kept while the run has not changed."""
        import json
        import subprocess

        from arbiter.children import python_module, run_child

        rep = self.ab_report(run_id)
        key = json.dumps([rep["status"], len(rep["blocks"]), len(rep["excluded"])])
        cached = self._plots.get(run_id)
        if cached is not None and cached[0] == key:
            return cached[1]
        done: subprocess.CompletedProcess[bytes] = run_child(
            python_module("arbiter.harness.report"),
            input=json.dumps(rep).encode(),
            capture_output=True,
            timeout=PLOT_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            raise LookupError(f"the plot could not be drawn: {done.stderr.decode(errors='replace')[-300:]}")
        self._plots[run_id] = (key, done.stdout)
        return done.stdout


class _QuietServer(uvicorn.Server):
    """uvicorn's server, whose housekeeping loop (the Date header, a stop asked for) wakes
    once a second instead of ten times: the Date header's resolution is a second anyway, and
    a stop waits a second at most."""

    async def main_loop(self) -> None:
        while not await self.on_tick(0):  # tick 0: the Date header is made afresh each time
            await asyncio.sleep(HOUSEKEEPING_S)


class HttpServer:
    def __init__(self, daemon: Node, host: str, port: int) -> None:
        warn_if_reachable(host, port)
        app = create_app(DaemonProvider(daemon), bind_host=host)
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
