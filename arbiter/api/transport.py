"""The daemon's Unix socket: one JSON request line, one JSON answer line, caller known by uid.

Kept free of heavy imports: the CLI uses the client half on every command.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import selectors
import socket
import socketserver
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("arbiter.socket")

MAX_REQUEST = 1 << 20
REQUEST_TIMEOUT_S = 30.0  # longer than the longest wait a request may ask for

SESSION_IDLE_S = 15.0  # a session that says nothing for this long is over

#: dispatch(op, args, peer) with peer = (pid, uid) of the caller
Handler = Callable[[str, dict[str, Any], tuple[int, int]], dict[str, Any]]


class Session(Protocol):
    """A connection that stays open for many requests (a session helper's)."""

    def handle(self, op: str, args: dict[str, Any]) -> dict[str, Any]: ...

    def close(self) -> None: ...


#: opens a session: (its opening request's args, peer) → (the answer, the session or None
#: when refused)
SessionOpener = Callable[[dict[str, Any], tuple[int, int]], tuple[dict[str, Any], Session | None]]


class DaemonUnavailable(Exception):
    """No daemon answers at the socket."""


class RequestRefused(Exception):
    """The daemon answered with an error."""

    def __init__(self, message: str, code: str = "") -> None:
        self.code = code
        super().__init__(message)


def peer_credentials(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a Unix socket (pid 0 where unknown)."""
    if hasattr(socket, "SO_PEERCRED"):
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _gid = struct.unpack("3i", creds)
        return pid, uid
    # BSD and macOS: LOCAL_PEERCRED (level 0, option 1) returns a struct xucred
    creds = sock.getsockopt(0, 1, 4 + 4 + 2 + 16 * 4)
    return 0, int(struct.unpack_from("I", creds, 4)[0])


class _RequestHandler(socketserver.StreamRequestHandler):
    server: _Server

    def _read(self) -> tuple[str, dict[str, Any]]:
        line = self.rfile.readline(MAX_REQUEST)
        if not line:
            raise EOFError
        try:
            request = json.loads(line)
        except RecursionError:  # json raises it, not ValueError, for arrays nested thousands deep
            raise ValueError("the request is nested too deeply") from None
        if not isinstance(request, dict) or not isinstance(request.get("op"), str):
            raise ValueError("a request is a JSON object with an op")
        return request.pop("op"), request

    def _answer(self, op: str, call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        try:
            return call()
        except (ValueError, KeyError, TypeError) as exc:
            return {"ok": False, "error": f"bad request ({op}): {exc}", "code": "BAD_REQUEST"}
        except Exception as exc:  # never let one request take the server down
            log.exception("request %s failed", op)
            return {"ok": False, "error": f"internal error: {type(exc).__name__}: {exc}", "code": "INTERNAL"}

    def _write(self, answer: dict[str, Any]) -> bool:
        try:
            self.wfile.write((json.dumps(answer, default=str) + "\n").encode())
            return True
        except OSError:
            return False  # the client went away

    def handle(self) -> None:
        self.connection.settimeout(REQUEST_TIMEOUT_S)  # a silent client must not hold a thread
        try:
            peer = peer_credentials(self.connection)
            op, args = self._read()
        except (EOFError, TimeoutError, OSError):
            return
        except ValueError as exc:
            self._write({"ok": False, "error": f"bad request: {exc}", "code": "BAD_REQUEST"})
            return
        opener = self.server.sessions.get(op)
        if opener is None:
            self._write(self._answer(op, lambda: self.server.dispatch(op, args, peer)))
            return
        session: Session | None = None
        try:
            answer, session = opener(args, peer)
            if not self._write(answer) or session is None:
                return
            self.connection.settimeout(SESSION_IDLE_S)
            while True:
                try:
                    op, args = self._read()
                except ValueError as exc:
                    answer = {"ok": False, "error": f"bad request: {exc}", "code": "BAD_REQUEST"}
                else:
                    answer = self._answer(op, functools.partial(session.handle, op, args))
                if not self._write(answer):
                    return
        except (EOFError, TimeoutError, OSError):
            return
        finally:
            if session is not None:
                session.close()


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    # socketserver's default backlog is 5: fifty `arbiter job run` started at once found it
    # full, and a connect to a full Unix socket fails at once (EAGAIN) rather than waiting
    request_queue_size = 128

    def __init__(
        self, path: str, dispatch: Handler, sessions: dict[str, SessionOpener], per_uid: int | None = None
    ) -> None:
        self.dispatch = dispatch
        self.sessions = sessions
        self.per_uid = per_uid
        self._held: dict[int, int] = {}  # uid → connections it holds open
        self._uids: dict[socket.socket, int] = {}
        self._held_lock = threading.Lock()
        super().__init__(path, _RequestHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread per connection, but no more than ``per_uid`` at once for an account other
        than root and the daemon's: a flood of silent connections holds threads and
        descriptors the daemon needs to protect anyone."""
        if self.per_uid is not None:
            try:
                _pid, uid = peer_credentials(request)
            except OSError:
                self.shutdown_request(request)
                return
            if uid not in (0, os.geteuid()):
                with self._held_lock:
                    held = self._held.get(uid, 0)
                    if held < self.per_uid:
                        self._held[uid] = held + 1
                        self._uids[request] = uid
                if held >= self.per_uid:
                    self._refuse(request, uid)
                    return
        super().process_request(request, client_address)

    def _refuse(self, request: socket.socket, uid: int) -> None:
        answer = {
            "ok": False,
            "error": f"uid {uid} holds {self.per_uid} connections to the daemon, the most quotas.connections_per_uid "
            "allows; close some and ask again",
            "code": "QUOTA",
        }
        try:
            request.setblocking(False)  # the accepting thread never waits on a client
            request.send((json.dumps(answer) + "\n").encode())
        except OSError:
            pass
        self.shutdown_request(request)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._held_lock:
                uid = self._uids.pop(request, None)
                if uid is not None:
                    self._held[uid] -= 1
                    if not self._held[uid]:
                        del self._held[uid]


class SocketServer:
    """Serves ``dispatch(op, args, peer)`` on a Unix socket anyone may connect to; an op
    named in ``sessions`` opens a session that keeps the connection for many requests; an
    account other than root and the daemon's holds at most ``connections_per_uid`` at once."""

    def __init__(
        self,
        path: Path,
        dispatch: Handler,
        sessions: dict[str, SessionOpener] | None = None,
        connections_per_uid: int | None = None,
    ) -> None:
        self.path = path
        if path.exists() or path.is_symlink():
            path.unlink()
        self._server = _Server(str(path), dispatch, sessions or {}, connections_per_uid)
        os.chmod(path, 0o666)  # anyone may read status; rights are checked per request
        self._thread = threading.Thread(target=self._serve, name="socket", daemon=True)
        # the loop sleeps until a connection or close() comes (socketserver's own loop
        # wakes twice a second to look for a shutdown)
        self._wake_r, self._wake_w = os.pipe()
        self._closing = False

    def start(self) -> None:
        self._thread.start()

    def _serve(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._server, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while not self._closing:
                ready = selector.select()
                if not self._closing and any(key.fileobj is self._server for key, _ in ready):
                    self._server.handle_request()  # ready: it accepts at once and hands the connection to a thread

    def close(self) -> None:
        self._closing = True
        os.write(self._wake_w, b"x")
        if self._thread.ident is not None:
            self._thread.join(timeout=5)
        os.close(self._wake_r)
        os.close(self._wake_w)
        self._server.server_close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


class Connection:
    """A connection to the daemon's socket for one request, or a session of many."""

    def __init__(self, socket_path: str | Path, timeout: float = 10.0) -> None:
        self.path = str(socket_path)
        self.timeout = timeout
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(self.path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            self._sock.close()
            raise DaemonUnavailable(f"no daemon answers at {socket_path} ({exc.strerror})") from None
        except PermissionError:
            self._sock.close()
            raise DaemonUnavailable(f"not allowed to open {socket_path}; check its folder's permissions") from None
        except TimeoutError:
            self._sock.close()
            raise DaemonUnavailable(f"the daemon at {socket_path} did not answer within {timeout:g}s") from None
        self._reader = self._sock.makefile("rb")

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        """Send one request and return its answer (raises DaemonUnavailable / RequestRefused)."""
        try:
            self._sock.sendall((json.dumps({"op": op, **args}) + "\n").encode())
            line = self._reader.readline(MAX_REQUEST * 16)
        except TimeoutError:
            raise DaemonUnavailable(f"the daemon at {self.path} did not answer within {self.timeout:g}s") from None
        except OSError as exc:
            raise DaemonUnavailable(f"the connection to {self.path} broke: {exc.strerror or exc}") from None
        if not line:
            raise DaemonUnavailable(f"the daemon at {self.path} closed the connection without answering")
        answer = json.loads(line)
        if not answer.get("ok"):
            raise RequestRefused(answer.get("error", "refused"), answer.get("code", ""))
        return answer  # type: ignore[no-any-return]

    def close(self) -> None:
        self._reader.close()
        self._sock.close()


def request(socket_path: str | Path, op: str, timeout: float = 10.0, **args: Any) -> dict[str, Any]:
    """Send one request; return the answer, or raise DaemonUnavailable / RequestRefused."""
    conn = Connection(socket_path, timeout)
    try:
        return conn.call(op, **args)
    finally:
        conn.close()
