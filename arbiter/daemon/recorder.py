"""The recording thread: SQLite commits and timeline observers, off the decision path."""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

from arbiter.store import PausedEntry, Store

log = logging.getLogger("arbiter.recorder")

Write = Callable[[sqlite3.Connection], None]


class Recorder:
    def __init__(self, store: Store, observe: Callable[[dict[str, Any]], None]) -> None:
        self.store = store
        self.observe = observe
        self._queue: queue.Queue[tuple[str, Any] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="recorder", daemon=True)
        self.failures = 0
        self.last_error = ""

    def start(self) -> None:
        self._thread.start()

    def event(self, code: str, subject: str, message: str, data: dict[str, Any] | None = None, t: float | None = None) -> None:
        self._queue.put(("event", {"t": t or time.time(), "code": code, "subject": subject, "message": message, "data": data or {}}))

    def write(self, fn: Write) -> None:
        self._queue.put(("write", fn))

    def paused(self, op: str, entry: PausedEntry) -> None:
        if op == "pause":
            self.write(lambda db: Store.put_paused(db, entry))
        else:
            self.write(lambda db: Store.drop_paused(db, entry.key))

    def flush(self, timeout: float = 5.0) -> None:
        done = threading.Event()
        self._queue.put(("flush", done))
        done.wait(timeout)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            batch = [item]
            while not self._queue.empty() and len(batch) < 500:
                batch.append(self._queue.get_nowait())
            stop = None in batch
            events: list[dict[str, Any]] = []
            flushes: list[threading.Event] = []
            writes: list[Write] = []
            for entry in batch:
                if entry is None:
                    continue
                kind, payload = entry
                if kind == "event":
                    events.append(payload)
                    writes.append(lambda db, e=payload: Store.add_event(db, e))
                elif kind == "write":
                    writes.append(payload)
                else:
                    flushes.append(payload)
            try:
                with self.store.transaction() as db:
                    for fn in writes:
                        fn(db)
            except (sqlite3.Error, OSError) as exc:
                # a full or read-only disk must not stop decisions; say so in status
                self.failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.error("recording failed: %s", self.last_error)
            for e in events:
                try:
                    self.observe(e)
                except Exception as exc:  # an exporter plugin must not stop recording
                    log.warning("timeline observer failed: %s", exc)
            for f in flushes:
                f.set()
            if stop:
                return
