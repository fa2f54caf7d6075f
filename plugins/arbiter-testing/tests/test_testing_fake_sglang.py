"""The fake SGLang's pause modes and its memory release, as its source has them: a pause holds
new requests; ``abort`` ends those in flight, ``retract`` puts them back in the queue to run
again after ``continue_generation``, ``in_place`` freezes them; a release reaching it with a
request running (or queued, generation not paused) kills it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from arbiter_testing import GIB, VramBoard
from arbiter_testing.fake_llm_servers import FakeSglangServer
from arbiter_testing.waiting import wait_until

REQUEST = {"text": "hi", "sampling_params": {"max_new_tokens": 1}}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FakeSglangServer]:
    with FakeSglangServer(VramBoard(tmp_path / "vram.json", 24 * GIB), gen_s=1.0) as fake:
        yield fake


def ask(url: str, into: list[Any]) -> None:
    answer = httpx.post(f"{url}/generate", json=REQUEST, timeout=30, trust_env=False)
    reason = answer.json().get("meta_info", {}).get("finish_reason", {}).get("type", "")
    into.append((answer.status_code, reason))


def running(server: FakeSglangServer) -> threading.Thread:
    answers: list[Any] = []
    worker = threading.Thread(target=ask, args=(server.url, answers))
    worker.answers = answers  # type: ignore[attr-defined]
    worker.start()
    wait_until(lambda: server.running == 1, 5, "the request running")
    return worker


def post(server: FakeSglangServer, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body or {}, timeout=30, trust_env=False)


def test_a_release_while_a_request_runs_kills_it(server: FakeSglangServer) -> None:
    worker = running(server)
    assert post(server, "/release_memory_occupation").status_code == 500
    worker.join(timeout=10)
    assert server.crashed and worker.answers[0][0] == 502  # type: ignore[attr-defined]


def test_retract_puts_the_running_request_back_and_a_paused_server_releases_and_finishes_it(
    server: FakeSglangServer,
) -> None:
    worker = running(server)
    assert post(server, "/pause_generation", {"mode": "retract"}).status_code == 200
    assert (server.running, server.queued) == (0, 1)
    assert post(server, "/release_memory_occupation").status_code == 200
    assert not server.crashed and server.releases == 1
    later: list[Any] = []
    newcomer = threading.Thread(target=ask, args=(server.url, later))
    newcomer.start()  # held by the pause, not refused
    assert post(server, "/resume_memory_occupation").status_code == 200
    assert worker.is_alive(), "paused: it waits for continue_generation"
    assert post(server, "/continue_generation").status_code == 200
    worker.join(timeout=10)
    newcomer.join(timeout=10)
    assert worker.answers == [(200, "length")] and later == [(200, "length")]  # type: ignore[attr-defined]


def test_the_default_pause_aborts_the_requests_in_flight(server: FakeSglangServer) -> None:
    worker = running(server)
    assert post(server, "/pause_generation").status_code == 200
    worker.join(timeout=10)
    assert worker.answers == [(200, "abort")] and server.aborted == 1  # type: ignore[attr-defined]
    assert post(server, "/release_memory_occupation").status_code == 200 and not server.crashed


def test_in_place_leaves_it_running_and_the_release_kills_it(server: FakeSglangServer) -> None:
    worker = running(server)
    assert post(server, "/pause_generation", {"mode": "in_place"}).status_code == 200
    assert server.running == 1
    assert post(server, "/release_memory_occupation").status_code == 500
    worker.join(timeout=10)
    assert server.crashed


def test_an_unknown_pause_mode_is_refused(server: FakeSglangServer) -> None:
    answer = post(server, "/pause_generation", {"mode": "drain"})
    assert answer.status_code == 400 and "Expected one of" in answer.text and not server.paused
