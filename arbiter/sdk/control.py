"""The job side of the wire protocol (standard library only, vendorable).

The daemon writes a control document (JSON, path in ``ARBITER_CONTROL``) to a temporary
file and renames it into place, then nudges the job with ``NUDGE_SIGNAL``.  A job reads it
at its safe points.  Outside arbiter (no ``ARBITER_CONTROL``) a job runs at duty 1 and is
never paused, so the same program runs unchanged either way.
"""

from __future__ import annotations

import json
import os
import select
import signal
import tempfile
import threading
import time
from typing import Any

PROTOCOL_VERSION = 1
CONTROL_ENV = "ARBITER_CONTROL"
EVENTS_ENV = "ARBITER_EVENTS"
NUDGE_SIGNAL = signal.SIGUSR1
STATES = ("run", "paused", "stop")
_POLL_S = 0.25


class Stopped(Exception):
    """Raised at a safe point once the daemon asked the job to stop."""


def write_control_document(path: str, state: str, gpu_duty: float, seq: int, reason: str = "") -> None:
    """Atomically replace the control document at ``path`` (temporary file, then rename)."""
    if state not in STATES:
        raise ValueError(f"control state {state!r} is not one of {', '.join(STATES)}")
    doc = {"v": PROTOCOL_VERSION, "seq": seq, "state": state, "gpu_duty": float(gpu_duty), "reason": reason}
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".control-", dir=directory)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_control_document(path: str) -> dict[str, Any] | None:
    """The control document, or ``None`` while it is missing, half-written or not one.

    Unknown keys are ignored (a later daemon may add some); a known key of the wrong type or
    out of range makes the document not count, so a job keeps obeying the last good one.
    """
    try:
        with open(path, encoding="utf-8-sig") as fh:  # -sig: a byte-order mark is not part of the document
            doc = json.load(fh)
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("state") not in STATES:
        return None
    seq, duty = doc.get("seq", -1), doc.get("gpu_duty", 1.0)
    if isinstance(seq, float) and seq.is_integer():
        seq = doc["seq"] = int(seq)  # JSON has one kind of number: 7.0 and 7e3 are whole numbers too
    if not isinstance(seq, int) or isinstance(seq, bool) or not _is_number(duty) or not 0.0 <= duty <= 1.0:
        return None  # NaN fails the range check too
    if not isinstance(doc.get("reason", ""), str):
        return None
    return doc


def ignore_nudges() -> None:
    """Make the nudge harmless to this process and the programs it starts.

    The nudge's default action ends a process, and a job may be nudged before it installs
    its handler (or never installs one), so launchers start jobs with it ignored.
    """
    signal.signal(NUDGE_SIGNAL, signal.SIG_IGN)


def append_event(path: str | None, event: str, **fields: Any) -> None:
    """Append one job event line to ``path`` (no-op without a path)."""
    if not path:
        return
    line = json.dumps({"t": time.time(), "event": event, **fields}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


class Control:
    """A job's view of its control document.

    ``safe_point()`` returns at once while the job may run, blocks while it is paused and
    raises :class:`Stopped` once it is told to stop.
    """

    def __init__(self, path: str | None = None, events: str | None = None, install_handler: bool = True) -> None:
        self.path = path if path is not None else os.environ.get(CONTROL_ENV)
        self.events = events if events is not None else os.environ.get(EVENTS_ENV)
        # a nudge is a byte in a pipe, never a threading.Event: a handler that set an Event could
        # land while this thread held the Event's lock inside wait(), and hang the job for good
        self._nudge_r, self._nudge_w = os.pipe()
        os.set_blocking(self._nudge_r, False)
        os.set_blocking(self._nudge_w, False)
        self.seq = -1
        self.state = "run"
        self.gpu_duty = 1.0
        self.reason = ""
        if self.path and install_handler and threading.current_thread() is threading.main_thread():
            signal.signal(NUDGE_SIGNAL, self._on_nudge)
        self.refresh()

    def __del__(self) -> None:
        for fd in (getattr(self, "_nudge_r", -1), getattr(self, "_nudge_w", -1)):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _on_nudge(self, signum: int, frame: Any) -> None:
        try:
            os.write(self._nudge_w, b"!")
        except OSError:
            pass  # the pipe is full: a nudge is already waiting

    def refresh(self) -> bool:
        """Re-read the control document; True when it changed."""
        if not self.path:
            return False
        doc = read_control_document(self.path)
        if doc is None or int(doc.get("seq", -1)) <= self.seq:
            return False
        self.seq = int(doc["seq"])
        self.state = doc["state"]
        self.gpu_duty = float(doc.get("gpu_duty", 1.0))
        self.reason = str(doc.get("reason", ""))
        return True

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds, waking early on a nudge; True when it changed."""
        ready, _, _ = select.select([self._nudge_r], [], [], max(0.0, timeout))
        if ready:
            try:
                while os.read(self._nudge_r, 512):
                    pass
            except BlockingIOError:
                pass  # drained
        return self.refresh()

    def safe_point(self) -> None:
        self.refresh()
        while self.state == "paused":
            self.wait(_POLL_S)
        if self.state == "stop":
            raise Stopped(self.reason or "stopped by arbiter")

    def phase(self, name: str) -> None:
        append_event(self.events, "phase", phase=name)

    def progress(self, done: int, total: int | None = None) -> None:
        append_event(self.events, "progress", done=done, total=total)

    def acknowledge_stop(self) -> int:
        """Report that the job stopped as asked; returns the exit code to exit with."""
        append_event(self.events, "stop_ack")
        return 0
