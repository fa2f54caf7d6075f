"""The daemon's Unix socket: one JSON request line, one JSON answer line, caller known by uid.

Kept free of heavy imports: the CLI uses the client half on every command.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

MAX_REQUEST = 1 << 20
REQUEST_TIMEOUT_S = 30.0  # longer than the longest wait a request may ask for

#: dispatch(op, args, peer) with peer = (pid, uid) of the caller
Handler = Callable[[str, dict[str, Any], tuple[int, int]], dict[str, Any]]


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

    def handle(self) -> None:
        try:
            self.connection.settimeout(REQUEST_TIMEOUT_S)  # a silent client must not hold a thread
            peer = peer_credentials(self.connection)
            line = self.rfile.readline(MAX_REQUEST)
            request = json.loads(line)
            if not isinstance(request, dict) or not isinstance(request.get("op"), str):
                raise ValueError("a request is a JSON object with an op")
            op = request.pop("op")
            answer = self.server.dispatch(op, request, peer)
        except (ValueError, KeyError, TypeError) as exc:
            answer = {"ok": False, "error": f"bad request: {exc}", "code": "BAD_REQUEST"}
        except TimeoutError:
            return
        except Exception as exc:  # never let one request take the server down
            answer = {"ok": False, "error": f"internal error: {type(exc).__name__}: {exc}", "code": "INTERNAL"}
        try:
            self.wfile.write((json.dumps(answer, default=str) + "\n").encode())
        except OSError:
            pass  # the client went away


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, dispatch: Handler) -> None:
        self.dispatch = dispatch
        super().__init__(path, _RequestHandler)


class SocketServer:
    """Serves ``dispatch(op, args, peer)`` on a Unix socket anyone may connect to."""

    def __init__(self, path: Path, dispatch: Handler) -> None:
        self.path = path
        if path.exists() or path.is_symlink():
            path.unlink()
        self._server = _Server(str(path), dispatch)
        os.chmod(path, 0o666)  # anyone may read status; rights are checked per request
        self._thread = threading.Thread(target=self._server.serve_forever, name="socket", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


def request(socket_path: str | Path, op: str, timeout: float = 10.0, **args: Any) -> dict[str, Any]:
    """Send one request; return the answer, or raise DaemonUnavailable / RequestRefused."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(str(socket_path))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise DaemonUnavailable(f"no daemon answers at {socket_path} ({exc.strerror})") from None
        except PermissionError:
            raise DaemonUnavailable(f"not allowed to open {socket_path}; check its folder's permissions") from None
        sock.sendall((json.dumps({"op": op, **args}) + "\n").encode())
        with sock.makefile("rb") as fh:
            line = fh.readline(MAX_REQUEST * 16)
    except TimeoutError:
        raise DaemonUnavailable(f"the daemon at {socket_path} did not answer within {timeout:g}s") from None
    finally:
        sock.close()
    if not line:
        raise DaemonUnavailable(f"the daemon at {socket_path} closed the connection without answering")
    answer = json.loads(line)
    if not answer.get("ok"):
        raise RequestRefused(answer.get("error", "refused"), answer.get("code", ""))
    return answer  # type: ignore[no-any-return]
