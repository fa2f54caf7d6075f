"""``arbiter helper``: reads, in a user's login, the sources the daemon may not read there,
and reports only their counts and phase states to the daemon.

It asks the daemon which sources lie in this user's home, runs those source plugins here
(never one that runs a command or watches processes), and sends each change the moment
its source sees it.  It pings every two seconds, asks again when the rules change, and
reconnects when the daemon restarts.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

from arbiter.api.transport import Connection, DaemonUnavailable, RequestRefused
from arbiter.config.loader import validate_kind_options
from arbiter.config.models import KindBlock
from arbiter.plugin import PluginContext, Source, SourceState
from arbiter.pluginmanager import PluginFailed, PluginHost

PING_S = 2.0
RETRY_S = 2.0

Key = tuple[str, int]


def _say(message: str) -> None:
    print(f"arbiter helper: {message}", file=sys.stderr, flush=True)


class Helper:
    def __init__(self, socket_path: str | Path, host: PluginHost, state_dir: Path) -> None:
        self.socket_path = socket_path
        self.host = host
        self.state_dir = state_dir
        self.running: dict[Key, tuple[str, Source]] = {}  # key → (its spec, the instance)
        self._conn: Connection | None = None
        self._send_lock = threading.Lock()
        self.reports = 0

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self._session(stop)
            except DaemonUnavailable as exc:
                _say(f"{exc}; trying again in {RETRY_S:g}s")
            except RequestRefused as exc:
                _say(f"the daemon refused: {exc}; trying again in {RETRY_S:g}s")
            except Exception as exc:  # a helper outlives whatever one session met
                _say(f"the session failed ({type(exc).__name__}: {exc}); trying again in {RETRY_S:g}s")
            finally:
                self._stop_all()
            stop.wait(RETRY_S)

    def _session(self, stop: threading.Event) -> None:
        conn = Connection(self.socket_path, timeout=10)
        self._conn = conn
        try:
            answer = conn.call("helper.attach")
            generation = answer["generation"]
            self._apply(answer["sources"], answer.get("home", ""))
            while not stop.wait(PING_S):
                with self._send_lock:
                    now = conn.call("ping")["generation"]
                if now != generation:
                    with self._send_lock:
                        answer = conn.call("sources")
                    generation = answer["generation"]
                    self._apply(answer["sources"], answer.get("home", ""))
        finally:
            with self._send_lock:
                self._conn = None
                conn.close()

    def _apply(self, listing: list[dict[str, Any]], home: str) -> None:
        wanted = {(s["rule"], s["index"]): s for s in listing}
        for key in list(self.running):
            spec = wanted.get(key)
            if spec is None or json.dumps(spec, sort_keys=True) != self.running[key][0]:
                self._stop(key)
        for key, spec in wanted.items():
            if key not in self.running:
                self._start(key, spec)
        _say(f"reading {len(self.running)} source(s) in {home or 'this home'} for the daemon")

    def _start(self, key: Key, spec: dict[str, Any]) -> None:
        kind = spec["kind"]
        info = self.host.kind("sources", kind)
        cls = getattr(info, "cls", None)
        if cls is None:
            _say(f"{key[0]}: no installed plugin registers source kind {kind!r}; the daemon keeps holding its work")
            return
        if cls.match_option is not None or getattr(cls.Options, "runs_command", False):
            _say(f"{key[0]}: a helper never runs {kind!r} sources (they run commands or watch processes)")
            return
        try:
            options = validate_kind_options(KindBlock(kind=kind, **spec["options"]), cls.Options)
            source: Source = self.host.call(
                f"sources/{kind}", cls, options, PluginContext(self.state_dir, rule_id=key[0])
            )
            self.running[key] = (json.dumps(spec, sort_keys=True), source)
            self.host.call(f"sources/{kind} start", source.start, lambda state: self._send(key, state))
            self._send(key, self.host.call(f"sources/{kind}", source.state))
        except (PluginFailed, ValueError) as exc:
            _say(f"{key[0]}: cannot read its {kind} source: {exc}")
            self._send(key, SourceState(readable=False, why=f"the helper cannot read it: {exc}"))

    def _send(self, key: Key, state: SourceState) -> None:
        """Called from sources' threads: one report line (counts and phase states only)."""
        with self._send_lock:
            if self._conn is None:
                return
            try:
                self._conn.call(
                    "report",
                    rule=key[0],
                    index=key[1],
                    readable=state.readable,
                    count=state.count,
                    rate=state.rate,
                    phase=state.phase,
                    why=state.why,
                    needs_helper=state.needs_helper,
                    changed_at=state.changed_at,
                )
                self.reports += 1
            except RequestRefused as exc:
                _say(f"report for {key[0]} refused: {exc}")
            except DaemonUnavailable:
                # an answer may still be on its way: this connection is out of step for good
                self._conn.close()
                self._conn = None  # the ping notices and the session starts over

    def _stop(self, key: Key) -> None:
        _, source = self.running.pop(key)
        try:
            self.host.call(f"close {key[0]} {key[1]}", source.close, timeout=2)
        except PluginFailed:
            pass

    def _stop_all(self) -> None:
        for key in list(self.running):
            self._stop(key)
