"""Work a plugin hands to a child process of its own, out of the daemon's interpreter.

Python code the daemon runs holds the interpreter lock while it runs: a tick that reads
a thousand files in Python holds it for tens of milliseconds, and the fast path (a phase
turning on, jobs paused within a millisecond or two) waits for it.  A plugin that does
such work each tick can have a child do it: the daemon then only waits on a pipe, which
lets the lock go, and decodes the answer.

The child runs this file as a script (``python -I -S childwork.py ...``): it imports the
standard library only, and loads the plugin's work module by its path, so neither the
plugin's package nor arbiter (nor pydantic) is imported there, and the child stays a bare
interpreter.  The work module must import the standard library only, too.

Requests and answers cross the pipes as :mod:`marshal` values (None, bool, int, float,
str, bytes, tuple, list, dict, set), each after its length in 4 bytes.  Each answer says
the CPU time the child spent on it, which the daemon counts in what its tick costs.
"""

from __future__ import annotations

import contextvars
import importlib.util
import logging
import marshal
import os
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from typing import Any, NoReturn

#: a marshalled request or answer's length comes first, in this many bytes
HEADER = 4

#: where each call adds the CPU seconds its child spent on it, where set: the daemon sets
#: it around each plugin call, so that what a tick costs counts the work handed to children
CHILD_CPU: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar("arbiter_child_cpu", default=None)


class ChildWorkFailed(Exception):
    """The child did not answer (exited, hung past the timeout), raised, or answered
    what no marshal value is; or it was given up and is not tried again yet."""


class ChildWorker:
    """Calls ``factory(*args)`` in a child once, then what it returned once per :meth:`call`.

    :param module_file: path of a module that imports only the standard library
    :param factory: name of a callable in it; what it returns is called with each request
    :param args: marshal values passed to ``factory``
    :param timeout_s: how long :meth:`call` waits for an answer
    :param retry_s: after a failure, how long calls fail at once before a new child starts

    The child starts on the first call.  On any failure it is killed, and :meth:`call`
    raises :class:`ChildWorkFailed` with the reason (also in :attr:`failure`): the caller
    then does the work itself.  The next child starts after ``retry_s``, with nothing of
    the last one's state.  The child ends when this object is closed or collected, or when
    the daemon exits (its request pipe then closes).  One call at a time (calls from other
    threads wait).
    """

    def __init__(
        self, module_file: str, factory: str, *args: Any, timeout_s: float = 3.0, retry_s: float = 60.0
    ) -> None:
        from arbiter.runtime.children import python_script  # the child itself imports the standard library only

        self._argv = python_script(__file__, module_file, factory, marshal.dumps(args).hex())
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.failure = ""  # why the last child was given up
        self._lock = threading.Lock()
        self._retry_at = 0.0
        self._child: list[subprocess.Popen[bytes]] = []  # the one running, if any
        weakref.finalize(self, _end, self._child)

    @property
    def pid(self) -> int | None:
        """The child's pid while one runs."""
        return self._child[0].pid if self._child else None

    def call(self, request: Any) -> Any:
        """The answer of the child's work to ``request`` (raises :class:`ChildWorkFailed`)."""
        try:
            data = marshal.dumps(request)
        except ValueError as exc:  # the caller's error: no child is started or given up for it
            raise TypeError(f"a child worker's request must be a marshal value: {exc}") from None
        with self._lock:
            if not self._child:
                if time.monotonic() < self._retry_at:
                    raise ChildWorkFailed(
                        f"{self.failure}; another child starts in {self._retry_at - time.monotonic():.0f}s"
                    )
                from arbiter.runtime.children import start_child

                try:
                    self._child.append(
                        start_child(self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
                    )
                except OSError as exc:
                    self._fail(f"it could not be started ({exc.strerror or exc})")
                assert self._child[0].stdin is not None
                os.set_blocking(self._child[0].stdin.fileno(), False)  # a hung child must not hang a write
            try:
                answer = self._exchange(self._child[0], data)
            except ChildWorkFailed as exc:
                self._fail(str(exc))
            spent = CHILD_CPU.get()
            if spent is not None:
                spent[0] += answer[2]
            if answer[0] != "ok":
                self._fail(f"it raised {answer[1]}")
            return answer[1]

    def close(self) -> None:
        """End the child; a later call starts another."""
        with self._lock:
            _end(self._child)

    def _exchange(self, child: subprocess.Popen[bytes], request: bytes) -> tuple[str, Any, float]:
        """The child's answer: ("ok", value, cpu_s) or ("raised", description, cpu_s)."""
        assert child.stdin is not None and child.stdout is not None
        deadline = time.monotonic() + self.timeout_s
        self._send(child, child.stdin.fileno(), len(request).to_bytes(HEADER, "big") + request, deadline)
        fd = child.stdout.fileno()
        size = int.from_bytes(self._read(child, fd, HEADER, deadline), "big")
        try:
            answer = marshal.loads(self._read(child, fd, size, deadline))
        except (EOFError, ValueError, TypeError) as exc:
            raise ChildWorkFailed(f"its answer did not decode ({exc})") from None
        if not (
            isinstance(answer, tuple)
            and len(answer) == 3
            and answer[0] in ("ok", "raised")
            and isinstance(answer[2], float)
            and 0.0 <= answer[2] < 3600.0
        ):
            raise ChildWorkFailed("it answered something other than an answer")
        return answer

    def _send(self, child: subprocess.Popen[bytes], fd: int, frame: bytes, deadline: float) -> None:
        data = memoryview(frame)  # a request larger than the pipe goes in pieces, uncopied
        while data:
            if not _ready(fd, select.POLLOUT, deadline):
                raise ChildWorkFailed(f"it did not take the request within {self.timeout_s:g}s")
            try:
                data = data[os.write(fd, data) :]
            except BlockingIOError:
                continue
            except BrokenPipeError:  # its end of the pipe closed: it exited, as a read would find
                raise ChildWorkFailed(f"it exited (status {_status(child)})") from None
            except OSError as exc:
                raise ChildWorkFailed(f"its request pipe broke ({exc.strerror or exc})") from None

    def _read(self, child: subprocess.Popen[bytes], fd: int, size: int, deadline: float) -> bytes:
        chunks: list[bytes] = []
        while size > 0:
            if not _ready(fd, select.POLLIN, deadline):
                raise ChildWorkFailed(f"it did not answer within {self.timeout_s:g}s")
            chunk = os.read(fd, size)
            if not chunk:
                raise ChildWorkFailed(f"it exited (status {_status(child)})")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def give_up(self, why: str) -> None:
        """End the child (the caller found its answer wrong): the next starts after ``retry_s``."""
        with self._lock:
            self._end_child(why)

    def _end_child(self, why: str) -> None:
        self.failure = f"the child worker was given up: {why}"
        _end(self._child)
        self._retry_at = time.monotonic() + self.retry_s
        # the work is still done (by the caller), only dearer: a warning, not a fault
        logging.getLogger(__name__).warning(
            "%s (%s); the work is done in this process until another child starts in %gs",
            self.failure,
            os.path.basename(self._argv[4]),
            self.retry_s,
        )

    def _fail(self, why: str) -> NoReturn:
        self._end_child(why)
        raise ChildWorkFailed(self.failure)


def _status(child: subprocess.Popen[bytes]) -> str:
    """A child's exit status, once its pipes say it has gone (it may take a moment to exit)."""
    try:
        return str(child.wait(timeout=1))
    except subprocess.TimeoutExpired:
        return "unknown: it closed its pipes but runs on"


def _ready(fd: int, event: int, deadline: float) -> bool:
    # poll, not select: a daemon keeping files open has descriptors past select's 1024
    poller = select.poll()
    poller.register(fd, event)
    return bool(poller.poll(max(0.0, deadline - time.monotonic()) * 1000))


def _end(children: list[subprocess.Popen[bytes]]) -> None:
    while children:
        child = children.pop()
        child.kill()  # it holds nothing that needs an orderly end
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                pipe.close()
        child.wait()


def _write_frame(fd: int, data: bytes) -> None:
    data = len(data).to_bytes(HEADER, "big") + data
    while data:
        data = data[os.write(fd, data) :]


def _read_frame(fd: int) -> bytes | None:
    """One request, or None when the daemon closed its end."""
    data = b""
    size: int | None = None
    while size is None or len(data) < size:
        chunk = os.read(fd, (HEADER if size is None else size) - len(data))
        if not chunk:
            return None
        data += chunk
        if size is None and len(data) == HEADER:
            size, data = int.from_bytes(data, "big"), b""
    return data


def serve(module_file: str, factory: str, args: tuple[Any, ...], requests: int = 0, answers: int = 1) -> None:
    """The child's loop: load the work, then answer each request until the pipe closes."""
    spec = importlib.util.spec_from_file_location("arbiter_child_work", module_file)
    if spec is None or spec.loader is None:
        raise SystemExit(f"arbiter child worker: cannot load {module_file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    work = getattr(module, factory)(*args)
    while (request := _read_frame(requests)) is not None:
        started = time.process_time()  # what each answer cost is sent with it
        try:
            value = work(marshal.loads(request))
            answer = marshal.dumps(("ok", value, time.process_time() - started))
        except Exception as exc:  # the daemon gives this child up and does the work itself
            answer = marshal.dumps(("raised", f"{type(exc).__name__}: {exc}", time.process_time() - started))
        _write_frame(answers, answer)


if __name__ == "__main__":
    # The daemon's terminal's ^C is the daemon's to act on; this child ends when its pipe does.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        serve(sys.argv[1], sys.argv[2], marshal.loads(bytes.fromhex(sys.argv[3])))
    except BrokenPipeError:
        pass  # the daemon went while an answer was being written
