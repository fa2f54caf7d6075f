"""Every route of the app, walked: what changes anything is POST with the token and a loopback
Host; what is GET changes nothing."""

from __future__ import annotations

import re
from typing import Any

from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from arbiter.daemon.api import NodeApi
from arbiter.daemon.core import Daemon
from arbiter.http.app import create_app

from .conftest import StartDaemon


class Spy:
    """The daemon's own provider, noting which of its methods each request calls."""

    def __init__(self, inner: NodeApi) -> None:
        self._inner = inner
        self.token = inner.token
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)
        if not callable(method):
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return method(*args, **kwargs)

        return call


def state_of(daemon: Daemon) -> dict[str, Any]:
    """What a mutation could change: wanted reloads, rules, jobs, runs, certificates."""
    daemon.recorder.flush()
    return {
        "reload": daemon.ticker.reload_wanted.is_set(),
        "rules": daemon.rulebook.generation,
        "jobs": sorted((j.id, j.state, j.user_hold) for j in daemon.jobs.active()),
        "runs": len(daemon.store.timeline(10_000, None, "AB_RUN_STARTED")),
        "reloaded": len(daemon.store.timeline(10_000, None, "CONFIG_RELOADED")),
        "ab": daemon.decider.engine_state.ab,
    }


def test_every_mutation_is_post_with_token_and_loopback_host_and_no_get_changes_anything(
    start_daemon: StartDaemon,
) -> None:
    daemon: Daemon = start_daemon(http={"enabled": False})
    spy = Spy(daemon.api)
    app = create_app(spy)
    client = TestClient(app, base_url="http://127.0.0.1:7807")
    token = {"Authorization": f"Bearer {daemon.token}"}
    routes = [r for r in app.routes if isinstance(r, APIRoute)]
    writes = [(m, r) for r in routes for m in sorted(r.methods or ()) if m not in ("GET", "HEAD")]
    assert writes, "the app has no mutation at all: the walk below would prove nothing"
    assert {m for m, _ in writes} == {"POST"}, "mutations are POST only"

    mutators: set[str] = set()
    for method, route in writes:
        path = re.sub(r"\{[^}]+\}", "nope", route.path)
        assert client.request(method, path).status_code == 401, path
        assert client.request(method, path, headers={**token, "Host": "rebind.example"}).status_code == 403, path
        spy.calls.clear()
        assert client.request(method, path, headers=token).status_code < 300, path
        mutators.update(spy.calls)
    assert "reload" in mutators

    for route in routes:
        if "GET" not in (route.methods or ()):
            continue
        path = re.sub(r"\{[^}]+\}", "nope", route.path)
        spy.calls.clear()
        answer = client.get(path, params={"subject": "node"} if path == "/v1/explain" else None, headers=token)
        assert answer.status_code < 500, (path, answer.text)
        assert not set(spy.calls) & mutators, f"GET {path} called {spy.calls}"


def test_no_get_changes_anything_on_a_quiet_daemon(start_daemon: StartDaemon) -> None:
    """Without any POST first, nothing a GET does shows in the daemon's state."""
    daemon: Daemon = start_daemon(http={"enabled": False})
    app = create_app(daemon.api)
    client = TestClient(app, base_url="http://127.0.0.1:7807")
    before = state_of(daemon)
    for route in app.routes:
        if isinstance(route, APIRoute) and "GET" in (route.methods or ()):
            path = re.sub(r"\{[^}]+\}", "nope", route.path)
            assert client.get(path).status_code < 500, path
    assert state_of(daemon) == before
