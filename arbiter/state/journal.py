"""What arbiter paused, kept where a killed daemon cannot lose it: :class:`PausedEntry` and
the append-only :class:`PausedJournal` the fast path writes before each pause, which the
recorder folds into the state database."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class PausedEntry:
    """One thing arbiter paused: a process (``how="tree"``) or a job's control document."""

    job_id: str
    how: str  # "tree" | "control"
    pid: int
    start_time: float
    translator: str
    control_path: str | None = None

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.job_id, self.how, self.pid)

    def fields(self) -> list[Any]:
        """Its fields in order, as the journal and the reflex process pass it (``PausedEntry(*fields)``)."""
        return [self.job_id, self.how, self.pid, self.start_time, self.translator, self.control_path]


class PausedJournal:
    """An append-only record of pauses, written before each pause with one ``write``.

    It survives the daemon being killed (the page cache outlives the process), costs
    microseconds on the fast path, and is folded into SQLite by the recorder.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.failures = 0
        self.last_error = ""

    def append(self, op: str, entry: PausedEntry) -> None:
        """Never raises: a full or read-only disk must not stop a pause that protects a
        program (the failure is counted, and status says the record is incomplete)."""
        self.append_many(op, [entry])

    def append_many(self, op: str, entries: Iterable[PausedEntry]) -> None:
        """:meth:`append` for several entries, in one line and one write."""
        self.append_rows(op, [self.rows(entries)])

    @staticmethod
    def rows(entries: Iterable[PausedEntry]) -> str:
        """Entries as :meth:`append_rows` takes them: made ahead of the pause, so that a
        phase pausing fifty jobs does not make them on its way to the first signal."""
        # field lists, not a dict per entry: the fields serialise several times faster
        return json.dumps([e.fields() for e in entries])[1:-1]

    def append_rows(self, op: str, rows: Iterable[str]) -> None:
        """Entries made by :meth:`rows`, in one line and one write."""
        joined = ", ".join(filter(None, rows))
        if not joined:
            return
        # the ops are plain words, quoted here: json.dumps is three Python calls on the fast path
        quoted = f'"{op}"' if op.isascii() and op.isalpha() else json.dumps(op)
        line = f'{{"op": {quoted}, "entries": [{joined}]}}\n'
        with self._lock:
            try:
                os.write(self._fd, line.encode())
            except OSError as exc:
                self.failures += 1
                self.last_error = f"{self.path}: {exc.strerror or exc}"

    def truncate(self) -> None:
        with self._lock:
            os.ftruncate(self._fd, 0)

    def close(self) -> None:
        with self._lock:
            os.close(self._fd)

    @staticmethod
    def replay(path: Path) -> dict[tuple[str, str, int], PausedEntry]:
        """What the journal says is paused now (a torn last line is ignored)."""
        out: dict[tuple[str, str, int], PausedEntry] = {}
        try:
            text = path.read_text()
        except FileNotFoundError:
            return out
        for line in text.splitlines():
            try:
                raw = json.loads(line)
                op = raw.pop("op")
                # a line of field lists; a dict per line from daemons before that
                entries = [PausedEntry(*row) for row in raw["entries"]] if "entries" in raw else [PausedEntry(**raw)]
            except (ValueError, TypeError, KeyError, AttributeError):
                continue
            for entry in entries:
                if op == "pause":
                    out[entry.key] = entry
                else:
                    out.pop(entry.key, None)
        return out
