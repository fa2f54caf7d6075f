"""The recording thread: SQLite commits and timeline observers, off the decision path."""

from __future__ import annotations

import functools
import logging
import queue
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from arbiter.engine import codes
from arbiter.state.journal import PausedEntry
from arbiter.state.store import Store

log = logging.getLogger("arbiter.recorder")
#: every timeline entry is one log line too: a foreground daemon says what it decides
timeline_log = logging.getLogger("arbiter.timeline")
#: entries that say something is wrong, logged as warnings
WARN_CODES = frozenset(
    {
        codes.CONFIG_REJECTED,
        codes.PLUGIN_FAILED,
        codes.PID_REUSED,
        codes.GPU_TIME_UNREADABLE,
        codes.PROTECTION_SOURCE_UNREADABLE,
        codes.VRAM_RELEASE_FAILED,
        codes.STATE_WRITE_FAILED,
    }
)

Write = Callable[[sqlite3.Connection], None]


class Recorder:
    def __init__(self, store: Store, observe: Callable[[dict[str, Any]], None]) -> None:
        self.store = store
        self.observe = observe
        self._queue: queue.Queue[tuple[str, Any] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="recorder", daemon=True)
        self.failures = 0
        self.last_error = ""
        self.failing_since: float | None = None  # wall time the writes began to fail, while they do
        self.lost = 0  # records dropped since then
        self.counts: Counter[str] = Counter()  # events recorded since start, by code (only this thread writes it)

    def start(self) -> None:
        self._thread.start()

    def failed(self, exc: BaseException) -> None:
        """A write made outside this thread failed (at start-up): counted like its own."""
        self.failures += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        if self.failing_since is None:
            self.failing_since = time.time()
        log.error("recording failed: %s", self.last_error)

    def event(
        self, code: str, subject: str, message: str, data: dict[str, Any] | None = None, t: float | None = None
    ) -> None:
        self._queue.put(
            ("event", {"t": t or time.time(), "code": code, "subject": subject, "message": message, "data": data or {}})
        )

    def write(self, fn: Write) -> None:
        self._queue.put(("write", fn))

    def paused(self, op: str, entries: Sequence[PausedEntry]) -> None:
        kept = tuple(entries)

        def write(db: sqlite3.Connection) -> None:
            for entry in kept:
                if op == "pause":
                    Store.put_paused(db, entry)
                else:
                    Store.drop_paused(db, entry.key)

        self.write(write)

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
                    self.counts[payload["code"]] += 1
                    writes.append(functools.partial(Store.add_event, event=payload))
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
                self.lost += len(writes)
                self.last_error = f"{type(exc).__name__}: {exc}"
                if self.failing_since is None:
                    self.failing_since = time.time()
                    log.error("recording failed: %s", self.last_error)
            else:
                if self.failing_since is not None and writes:
                    # on the timeline once it can be written again: for how long, and what was lost
                    since, lost = self.failing_since, self.lost
                    self.failing_since, self.lost = None, 0
                    self.event(
                        codes.STATE_WRITE_FAILED,
                        "node",
                        f"the state database could not be written for {time.time() - since:.0f}s "
                        f"({self.last_error}); {lost} record(s) from then were lost; it is written again",
                        {"since": since, "lost": lost, "error": self.last_error},
                    )
            for e in events:
                level = logging.WARNING if e["code"] in WARN_CODES else logging.INFO
                timeline_log.log(level, "%s %s: %s", e["code"], e["subject"], e["message"])
                try:
                    self.observe(e)
                except Exception as exc:  # an exporter plugin must not stop recording
                    log.warning("timeline observer failed: %s", exc)
            for f in flushes:
                f.set()
            if stop:
                return
