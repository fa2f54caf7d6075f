"""The daemon's end of the reflex process (:mod:`arbiter.reflex.process`).

The link starts the process when an immediate rule has a phase source, tells it which
sources to watch, arms it after each decision, and hands the daemon the process's lines
(its readings, and what it paused and resumed) in the order it wrote them.  A process that
exits or stops answering is killed and started again later; meanwhile, and for any source
it cannot watch, the daemon's own watchers report to the decision thread, which acts.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import select
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from arbiter.reflex.process import ARMS_AT, CATCH_UP_S, LINES_AT, read_count, write_count
from arbiter.reflex.wire import Arm, ArmTable, Fatal, Reading, Setup, Sources, SourceSpec, ToProcess, encode, to_daemon
from arbiter.runtime.children import python_module, start_child

log = logging.getLogger(__name__)

#: after the process was given up, how long before another is started (doubling up to the
#: second while each fails)
RETRY_S = 10.0
RETRY_MAX_S = 600.0
#: how long the daemon waits for the lock the process holds while it signals
LOCK_WAIT_S = 2.0


@dataclass(frozen=True)
class Gone:
    """The process was given up, and every line it wrote was read: ``why``."""

    why: str


class ReflexLink:
    """:param deliver: called on the link's reader thread after lines arrive (the daemon
    then takes them, with :meth:`take`, in order)."""

    def __init__(self, setup: Setup, state_dir: Path, deliver: Callable[[], None]) -> None:
        self.setup = replace(setup, lock=str(state_dir / "reflex.lock"))
        self.deliver = deliver
        self.failure = ""  # why the last process was given up
        self._lock_fd = os.open(self.setup.lock, os.O_RDWR | os.O_CREAT, 0o600)
        self._proc: subprocess.Popen[bytes] | None = None
        self._specs: list[SourceSpec] = []
        self._arm: ArmTable | None = None
        self._arms = 0
        self._received = 0  # lines read from the process now running
        self._pending: deque[Reading | Gone] = deque()
        self._cv = threading.Condition()
        self._retry_at = 0.0
        self._retry_s = RETRY_S
        self._readers = 0  # reader threads running (the process's, and one given up still being read)
        self._closed = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    # --- the process ------------------------------------------------------------------------

    def sync(self, specs: list[SourceSpec]) -> None:
        """The sources the process is to watch now (starting it, if it is not running)."""
        if self._closed:
            return
        if self._proc is None:
            if not specs or time.monotonic() < self._retry_at:
                self._specs = []
                return
            try:
                self._spawn()
            except OSError as exc:  # out of processes or descriptors: the daemon acts itself meanwhile
                self.failure = f"it could not be started: {exc.strerror or exc}"
                self._retry_at = time.monotonic() + RETRY_S
                log.warning("the reflex process %s", self.failure)
                return
        if specs != self._specs:
            self._specs = specs
            self._send(Sources(tuple(specs)))

    def _spawn(self) -> None:
        # the counts in the lock file are this process's: the last one's are void
        write_count(self._lock_fd, ARMS_AT, 0)
        write_count(self._lock_fd, LINES_AT, 0)
        self._arms, self._received, self._arm = 0, 0, None
        self._proc = start_child(python_module("arbiter.reflex.process"), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self._proc.stdin is not None
        os.set_blocking(self._proc.stdin.fileno(), False)
        self._readers += 1
        threading.Thread(target=self._read, args=(self._proc,), name="reflex-link", daemon=True).start()
        self._send(self.setup)

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        """Every line of ``proc`` to the end of its output, even once it was given up (what
        it did still counts; its readings then do not), and then ``gone``: after all of them."""
        assert proc.stdout is not None
        fatal = ""
        try:
            for raw in proc.stdout:
                with self._cv:
                    current = proc is self._proc
                    if current:
                        self._received += 1
                    try:
                        line = to_daemon(raw)
                    except (ValueError, KeyError, TypeError):
                        continue
                    if isinstance(line, Fatal):
                        fatal = line.why
                        continue
                    if not current:
                        line = replace(line, stale=True)
                    elif line.state is not None:
                        self._retry_s = RETRY_S  # it works: a later failure is tried again soon
                    self._pending.append(line)
                    self._cv.notify_all()
                self.deliver()
        finally:
            proc.stdout.close()
            code = proc.wait()
            with self._cv:
                if proc is self._proc:
                    self._give_up(fatal or f"it exited with status {code}")
                if not self._closed:
                    self._pending.append(Gone(self.failure))
                self._readers -= 1
                self._cv.notify_all()
            self.deliver()

    def _give_up(self, why: str) -> None:
        """Under ``_cv``: end the process (its reader then says ``gone``); another starts
        after a wait that doubles with each failure in a row."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(OSError, ValueError):
            if proc.stdin is not None:
                proc.stdin.close()
        self._specs = []
        self._cv.notify_all()
        if self._closed:
            return
        self.failure = why
        self._retry_at = time.monotonic() + self._retry_s
        self._retry_s = min(2 * self._retry_s, RETRY_MAX_S)
        log.warning("the reflex process was given up (%s): the daemon acts on phase changes itself", why)

    def _drained(self) -> bool:
        """Under ``_cv``, after a give-up: wait until every line of the processes given up
        is read (each reader ends with ``gone``)."""
        return self._cv.wait_for(lambda: not self._readers, timeout=CATCH_UP_S)

    def _send(self, message: ToProcess) -> bool:
        """One line to the process, or give it up when it takes none for a second."""
        proc = self._proc
        if proc is None or proc.stdin is None:
            return False
        data = encode(message)
        fd, deadline = proc.stdin.fileno(), time.monotonic() + CATCH_UP_S
        try:
            while data:
                if not select.select([], [fd], [], max(0.0, deadline - time.monotonic()))[1]:
                    raise TimeoutError("it took no message for a second")
                data = data[os.write(fd, data) :]
        except (OSError, ValueError, TimeoutError) as exc:
            with self._cv:
                if proc is self._proc:
                    self._give_up(f"a message to it failed: {exc}")
            return False
        return True

    def close(self) -> None:
        """Stop the process and read its last lines; they stay for :meth:`take`."""
        self._closed = True
        proc = self._proc
        if proc is not None:
            with contextlib.suppress(OSError, ValueError):
                assert proc.stdin is not None
                proc.stdin.close()  # it exits when its input closes, once a reading in hand is told
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
        with self._cv:
            if not self._cv.wait_for(lambda: not self._readers, timeout=2):
                self._give_up("the daemon stopped")
                self._cv.wait_for(lambda: not self._readers, timeout=2)
        os.close(self._lock_fd)

    # --- acting beside it ---------------------------------------------------------------------

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The lock both processes signal under; once it is held, every line the process
        wrote under it has arrived.  Taken by the decision thread alone, never nested."""
        if self._proc is None or self._closed:
            yield
            return
        deadline, locked = time.monotonic() + LOCK_WAIT_S, False
        while not locked:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked = True
            except BlockingIOError:
                if time.monotonic() > deadline:
                    with self._cv:  # killed, it signals nothing more: go on without the lock, with its lines
                        self._give_up("it held the signalling lock for two seconds")
                        self._drained()
                    break
                time.sleep(0.0002)
        try:
            if locked:
                wanted = read_count(self._lock_fd, LINES_AT)
                with self._cv:
                    if self._proc is not None and not self._cv.wait_for(
                        lambda: self._received >= wanted, timeout=CATCH_UP_S
                    ):
                        self._give_up("its lines stopped arriving")
                        self._drained()
            yield
        finally:
            if locked:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def take(self) -> list[Reading | Gone]:
        """The lines that arrived, in order (on the decision thread)."""
        with self._cv:
            out = list(self._pending)
            self._pending.clear()
        return out

    def arm(self, arm: ArmTable) -> None:
        """What the process does on each phase change from now on; under :meth:`held`."""
        if self._proc is None or arm == self._arm:
            return
        self._arms += 1
        if self._send(Arm(self._arms, arm)):
            self._arm = arm
            write_count(self._lock_fd, ARMS_AT, self._arms)
