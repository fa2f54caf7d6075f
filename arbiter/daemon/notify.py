"""Telling a service manager how the daemon is doing, over the ``$NOTIFY_SOCKET`` protocol.

The protocol is one datagram of ``KEY=value`` lines to an AF_UNIX socket whose address the
manager puts in ``$NOTIFY_SOCKET`` (a path, or ``@name`` for an abstract address).  No client
library is needed, and with the variable unset every call here does nothing, so a daemon run
from a terminal behaves exactly as before.

The watchdog is fed from the tick thread's progress, not from a timer of its own: a tick that
hangs (a wedged plugin call, a stuck scan) stops the pings, and the manager restarts the
daemon.  Sending never blocks: a datagram that cannot go at once is dropped and the next
ping tries again.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping, MutableMapping

log = logging.getLogger("arbiter.daemon.notify")

SOCKET_ENV = "NOTIFY_SOCKET"
WATCHDOG_USEC_ENV = "WATCHDOG_USEC"
WATCHDOG_PID_ENV = "WATCHDOG_PID"


def _address(value: str) -> str | bytes:
    # an abstract address is spelled with a leading "@" and sent with a leading NUL byte
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    return value


def watchdog_interval(environ: Mapping[str, str], pid: int) -> float | None:
    """Seconds between pings (half the manager's timeout), or None when it wants none."""
    raw = environ.get(WATCHDOG_USEC_ENV, "").strip()
    if not raw:
        return None
    owner = environ.get(WATCHDOG_PID_ENV, "").strip()
    if owner and owner != str(pid):
        return None  # the manager watches another process (we were started by it, say)
    try:
        usec = int(raw)
    except ValueError:
        log.warning("%s=%r is not a number of microseconds; the watchdog is not fed", WATCHDOG_USEC_ENV, raw)
        return None
    return usec / 2e6 if usec > 0 else None


class Notifier:
    """Sends READY, STATUS, WATCHDOG and STOPPING to the manager, if there is one."""

    def __init__(self, address: str | None, interval_s: float | None) -> None:
        self.address = address or None
        self.interval_s = interval_s if self.address else None
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()  # the tick and main threads both send
        self._last_ping: float | None = None
        self._failing = False

    @classmethod
    def from_environ(cls, environ: MutableMapping[str, str], pid: int | None = None) -> Notifier:
        """Read the manager's variables and take them out of ``environ``: the commands the daemon
        starts (exec sources, probes) must not speak for it."""
        address = environ.pop(SOCKET_ENV, None)
        interval = watchdog_interval(environ, os.getpid() if pid is None else pid)
        environ.pop(WATCHDOG_USEC_ENV, None)
        environ.pop(WATCHDOG_PID_ENV, None)
        return cls(address, interval)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *lines: str) -> bool:
        """One datagram; False when it could not go (never raises, never waits)."""
        if self.address is None:
            return False
        payload = "\n".join(lines).encode()
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # not inherited
                    self._sock.setblocking(False)
                self._sock.sendto(payload, _address(self.address))
            except OSError as exc:
                if not self._failing:  # said once, not on every ping
                    log.warning("cannot notify the service manager at %s: %s", self.address, exc)
                self._failing = True
                return False
            if self._failing:
                log.info("notifying the service manager at %s again", self.address)
            self._failing = False
            return True

    def ready(self, status: str) -> bool:
        return self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def status(self, status: str) -> bool:
        return self.send(f"STATUS={status}")

    def stopping(self, status: str = "stopping: resuming paused work") -> bool:
        return self.send("STOPPING=1", f"STATUS={status}")

    def alive(self, now: float, status: Callable[[], str] | None = None) -> bool:
        """The tick made progress: ping when half the watchdog timeout has passed since the last
        ping (with a fresh STATUS, computed only then).  True when a ping went."""
        if self.interval_s is None:
            return False
        if self._last_ping is not None and now - self._last_ping < self.interval_s:
            return False
        self._last_ping = now
        lines = ["WATCHDOG=1"]
        if status is not None:
            try:
                lines.append(f"STATUS={status()}")
            except Exception as exc:  # a status line must never cost the ping
                log.debug("status line failed: %s", exc)
        return self.send(*lines)

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
