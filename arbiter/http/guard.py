"""Who the HTTP listener answers.

On a loopback listener anyone on the machine may read (as anyone may read status over the
socket), but only under a loopback ``Host``: a web page whose name an attacker points at
127.0.0.1 (DNS rebinding) is refused rather than shown the node's jobs.  A mutation needs
the token and a loopback ``Host`` (see ``create_app``).  A
listener other hosts can reach answers nothing without the token, reads included: status,
explain and the timeline name jobs, users' programs and their paths.  ``/healthz`` stays
open there, because it says only "ok" and the service managers and load balancers that
probe it hold no secrets.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

log = logging.getLogger("arbiter.http")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: answered without the token even on a listener others can reach (see the module)
OPEN_PATHS = frozenset({"/healthz"})
TOKEN_HINT = "send the token from $state_dir/token as 'Authorization: Bearer TOKEN'"


def bearer_ok(authorization: str | bytes | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token`` (compared in constant time)."""
    if not authorization or not token:
        return False
    given = authorization if isinstance(authorization, bytes) else authorization.encode("latin-1", "replace")
    return hmac.compare_digest(given, f"Bearer {token}".encode())


def is_loopback_bind(host: str) -> bool:
    """Whether a listen address reaches only this machine.  A name other than
    ``localhost`` may resolve anywhere, so it counts as reachable (fail safe)."""
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback_host(host_header: str | bytes | None) -> bool:
    """Whether a ``Host`` header (``name[:port]``, ``[v6]:port``) names this machine's loopback."""
    if not host_header:
        return False
    host = (host_header.decode("latin-1") if isinstance(host_header, bytes) else host_header).strip()
    if host.startswith("["):
        host = host[1 : host.find("]")]
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    return is_loopback_bind(host)


async def _refuse(send: Send, status: int, detail: str, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> bytes | None:
    return next((v for k, v in scope.get("headers", ()) if k == name), None)


class LoopbackHostGate:
    """ASGI middleware for a loopback listener: every request needs a loopback ``Host``."""

    def __init__(self, app: AsgiApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not is_loopback_host(_header(scope, b"host")):
            await _refuse(
                send,
                403,
                "this listener answers only requests addressed to this machine's loopback "
                "(Host: 127.0.0.1:PORT or localhost:PORT)",
            )
            return
        await self.app(scope, receive, send)


class TokenGate:
    """ASGI middleware: every request but ``OPEN_PATHS`` needs the token.  Middleware, not a
    route dependency, so ``/openapi.json``, ``/docs`` and paths that match no route are
    covered too."""

    def __init__(self, app: AsgiApp, token: Callable[[], str]) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope.get("path") not in OPEN_PATHS
            and not bearer_ok(_header(scope, b"authorization"), self.token())
        ):
            await _refuse(
                send,
                401,
                f"this listener is reachable from other hosts: {TOKEN_HINT}",
                ((b"www-authenticate", b"Bearer"),),
            )
            return
        await self.app(scope, receive, send)


def warn_if_reachable(host: str, port: int) -> bool:
    """Log, at start, that a listener is reachable from other hosts; whether it is."""
    if is_loopback_bind(host):
        return False
    log.warning(
        "HTTP listens on %s:%s, which other hosts may reach: every request but %s needs the token from "
        "$state_dir/token, and mutations are refused unless the Host header is loopback. Set http.listen "
        "to 127.0.0.1:PORT to serve this machine only.",
        host,
        port,
        ", ".join(sorted(OPEN_PATHS)),
    )
    return True
