"""Who the HTTP listener answers: reads are open on loopback only; a listener other hosts can
reach answers nothing but /healthz without the token; mutations always need the token and a
loopback Host (DNS rebinding), and are POST only."""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

import httpx
import psutil
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.routing import Route

from arbiter.daemon.core import Daemon
from arbiter.http.app import create_app
from arbiter.http.guard import OPEN_PATHS, bearer_ok, is_loopback_bind
from arbiter_testing import run_as
from arbiter_testing.node import HarnessNode

from .conftest import StartDaemon

REMOTE_HOST = "192.0.2.7:7807"  # TEST-NET-1: a name no loopback resolves to
READS = {"GET", "HEAD"}


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "nope", path)


def every_route(app: FastAPI) -> list[tuple[str, str]]:
    """(method, path) for every route the app serves, its own /openapi.json and /docs too."""
    out = []
    for route in app.routes:
        assert isinstance(route, Route), route
        for method in sorted(route.methods or ()):
            if method != "HEAD":
                out.append((method, concrete(route.path)))
    return out


def non_loopback_ip() -> str | None:
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return str(a.address)
    return None


def test_which_listen_addresses_reach_only_this_machine() -> None:
    assert is_loopback_bind("127.0.0.1") and is_loopback_bind("127.1.2.3") and is_loopback_bind("::1")
    assert is_loopback_bind("[::1]") and is_loopback_bind("localhost")
    for reachable in ("0.0.0.0", "::", "10.0.0.5", "myhost", "fe80::1", ""):
        assert not is_loopback_bind(reachable), reachable


def test_the_token_is_compared_whole() -> None:
    assert bearer_ok("Bearer s3cret-token", "s3cret-token") and bearer_ok(b"Bearer s3cret-token", "s3cret-token")
    for wrong in (None, "", "s3cret-token", "Bearer s3cret", "Bearer s3cret-token ", "bearer s3cret-token", "Bearer "):
        assert not bearer_ok(wrong, "s3cret-token"), wrong
    assert not bearer_ok("Bearer ", ""), "an empty token must never match"


def test_a_reachable_bind_answers_nothing_but_healthz_without_the_token(start_daemon: StartDaemon) -> None:
    daemon: Daemon = start_daemon(http={"enabled": False})
    app = create_app(daemon.api, bind_host="0.0.0.0")
    client = TestClient(app, base_url="http://127.0.0.1:7807")
    good = {"Authorization": f"Bearer {daemon.token}"}
    routes = [*every_route(app), ("GET", "/no/such/path")]
    assert ("GET", "/openapi.json") in routes and ("POST", "/v1/reload") in routes
    for method, path in routes:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": daemon.token}):
            answer = client.request(method, path, headers=headers)
            if path in OPEN_PATHS:
                assert answer.status_code == 200, (method, path)
            else:
                assert answer.status_code == 401, (method, path, headers, answer.text)
                assert "token" in answer.json()["detail"]
        with_token = client.request(method, path, headers=good)
        assert with_token.status_code not in (401, 403), (method, path, with_token.text)
    # and a mutation still needs a loopback Host, token or not
    assert client.post("/v1/reload", headers={**good, "Host": REMOTE_HOST}).status_code == 403


def test_a_loopback_bind_reads_openly_and_mutates_only_with_token_and_loopback_host(start_daemon: StartDaemon) -> None:
    daemon: Daemon = start_daemon(http={"enabled": False})
    app = create_app(daemon.api, bind_host="127.0.0.1")
    client = TestClient(app, base_url="http://127.0.0.1:7807")
    good = {"Authorization": f"Bearer {daemon.token}"}
    for method, path in every_route(app):
        if method in READS:
            assert client.request(method, path).status_code not in (401, 403), path
            continue
        assert client.request(method, path).status_code == 401, (method, path)
        assert client.request(method, path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        for host in (REMOTE_HOST, "evil.example", "127.0.0.1.evil.example", "localhost.evil.example:7807"):
            answer = client.request(method, path, headers={**good, "Host": host})
            assert answer.status_code == 403, (method, path, host)
        for host in ("127.0.0.1:7807", "localhost:7807", "[::1]:7807"):
            answer = client.request(method, path, headers={**good, "Host": host})
            assert answer.status_code < 300, (method, path, host, answer.text)


def test_a_real_daemon_listening_on_every_address(tmp_path: Path) -> None:
    node = HarnessNode(tmp_path, http={"listen": "0.0.0.0:0"})
    try:
        node.start()
        port = int(node.info()["http"].rsplit(":", 1)[1])
        assert "other hosts may reach" in node.log() and "needs the token" in node.log()
        token = (node.state_dir / "token").read_text().strip()
        good = {"Authorization": f"Bearer {token}"}
        addresses = ["127.0.0.1"] + ([ip] if (ip := non_loopback_ip()) else [])
        for address in addresses:
            base = f"http://{address}:{port}"
            for path in ("/v1/status", "/v1/timeline", "/", "/metrics", "/openapi.json", "/v1/explain"):
                assert httpx.get(base + path, timeout=10).status_code == 401, (address, path)
                assert httpx.get(base + path, headers=good, timeout=10).status_code == 200, (address, path)
            assert httpx.get(base + "/healthz", timeout=10).text == "ok"
            assert httpx.post(base + "/v1/reload", timeout=10).status_code == 401
        if len(addresses) > 1:
            # reached by its LAN address, the Host header says so: refused even with the token
            remote = httpx.post(f"http://{addresses[1]}:{port}/v1/reload", headers=good, timeout=10)
            assert remote.status_code == 403
        assert httpx.post(f"http://127.0.0.1:{port}/v1/reload", headers=good, timeout=10).status_code == 200
    finally:
        node.close()


def test_a_real_daemon_on_loopback_reads_openly(tmp_path: Path) -> None:
    node = HarnessNode(tmp_path)
    try:
        node.start()
        base = node.info()["http"]
        assert base.startswith("http://127.0.0.1:") and "other hosts may reach" not in node.log()
        token = (node.state_dir / "token").read_text().strip()
        for path in ("/v1/status", "/v1/timeline", "/", "/metrics", "/healthz"):
            assert httpx.get(base + path, timeout=10).status_code == 200, path
        rebound = httpx.post(
            base + "/v1/reload", headers={"Authorization": f"Bearer {token}", "Host": "rebind.example:80"}, timeout=10
        )
        assert rebound.status_code == 403
    finally:
        node.close()


@pytest.mark.parametrize("bind", ["127.0.0.1", "0.0.0.0"])
def test_the_page_and_docs_never_echo_the_token(start_daemon: StartDaemon, bind: str) -> None:
    daemon: Daemon = start_daemon(http={"enabled": False})
    client = TestClient(create_app(daemon.api, bind_host=bind), base_url="http://127.0.0.1:7807")
    good = {"Authorization": f"Bearer {daemon.token}"}
    for path in ("/", "/v1/status", "/openapi.json", "/metrics", "/v1/explain", "/v1/timeline"):
        assert daemon.token not in client.get(path, headers=good).text, path


@pytest.mark.skipif(os.geteuid() != 0, reason="the connections are held as another account, which needs root")
def test_a_connection_that_never_sends_a_request_is_closed(tmp_path: Path) -> None:
    """Any account may connect to the listener: one that sends nothing, or its request head a
    byte at a time, is cut off after a few seconds instead of being held for ever."""
    from arbiter.http.protocol import HEAD_TIMEOUT_S

    node = HarnessNode(tmp_path)
    node.start()
    try:
        host, port = node.info()["http"].removeprefix("http://").rsplit(":", 1)

        def hold(trickle: bool) -> float:
            started = time.monotonic()
            with socket.create_connection((host, int(port)), timeout=HEAD_TIMEOUT_S * 4) as conn:
                if trickle:
                    conn.settimeout(0.5)
                    for byte in b"GET /v1/status HTTP/1.1\r\nHost: localhost\r\n":
                        try:
                            conn.send(bytes([byte]))
                            if conn.recv(1) == b"":
                                break
                        except TimeoutError:
                            continue
                        except OSError:
                            break
                    conn.settimeout(HEAD_TIMEOUT_S * 4)
                try:
                    while conn.recv(4096):
                        pass
                except ConnectionResetError:
                    pass
            return time.monotonic() - started

        silent = run_as("nobody", lambda: hold(False))
        trickling = run_as("nobody", lambda: hold(True))
        assert HEAD_TIMEOUT_S - 0.5 <= silent < HEAD_TIMEOUT_S * 3, silent
        assert trickling < HEAD_TIMEOUT_S * 3, trickling
        assert node.status()  # the listener still serves
    finally:
        node.close()
