"""The VRAM board: the ``fake`` reader's state file, shared by every fake program of a test.

Each fake program (a fake LLM server, a fake diffusion server, a test's own stand-in job)
writes the VRAM its process holds and how busy it is; the device's free VRAM is the total
less what they all hold.  Writers may be threads of one process or separate processes, so
each update is a read-modify-write under an exclusive lock on ``<state file>.lock``, and the
file itself is replaced atomically (:func:`arbiter_testing.fake_reader.write_state`), so the
reader never sees half of it.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from arbiter_testing.fake_reader import write_state

GIB = 1 << 30


class VramBoard:
    """Read and update a fake reader state file for one device of ``total_bytes``."""

    def __init__(self, path: str | os.PathLike[str], total_bytes: int = 24 * GIB) -> None:
        self.path = Path(path)
        self.total_bytes = total_bytes
        self._lock = threading.Lock()  # flock is per open file: threads of one process need their own lock
        with self._locked():
            if not self.path.exists():
                self._write({"readable": True, "device": "gpu", "processes": {}})

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock, open(f"{self.path}.lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _read(self) -> dict[str, Any]:
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {"readable": True, "device": "gpu", "processes": {}}
        if not isinstance(doc, dict):
            raise ValueError(f"{self.path} does not hold a JSON object")
        return doc

    def _write(self, doc: dict[str, Any]) -> None:
        procs = doc.setdefault("processes", {})
        held = sum(int(p.get("vram_bytes") or 0) for p in procs.values())
        doc["vram_total_bytes"] = self.total_bytes
        doc["vram_free_bytes"] = max(0, self.total_bytes - held)
        write_state(self.path, doc)

    def set(self, pid: int, vram_bytes: int, busy_share: float = 0.0) -> None:
        """What process ``pid`` holds now and how busy it is (a share of wall time)."""
        with self._locked():
            doc = self._read()
            doc.setdefault("processes", {})[str(pid)] = {"busy_share": float(busy_share), "vram_bytes": int(vram_bytes)}
            self._write(doc)

    def remove(self, pid: int) -> None:
        with self._locked():
            doc = self._read()
            doc.setdefault("processes", {}).pop(str(pid), None)
            self._write(doc)

    def held(self, pid: int) -> int:
        entry = self._read().get("processes", {}).get(str(pid)) or {}
        return int(entry.get("vram_bytes") or 0)

    def free_bytes(self) -> int:
        doc = self._read()
        held = sum(int(p.get("vram_bytes") or 0) for p in doc.get("processes", {}).values())
        return max(0, self.total_bytes - held)
