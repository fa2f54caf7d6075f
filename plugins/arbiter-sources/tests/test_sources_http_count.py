"""``http_count`` against real HTTP servers on 127.0.0.1 (the fake LLM and diffusion servers):
busy from the lists an answer holds, the loaded models' names, ``vram_floor_gb``
corroboration and ``stale_after_s`` with a fake clock, wake-ups, and failed probes read as
unknown (busy)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from arbiter.plugin import PluginContext, SourceState
from arbiter_sources.http_count import Answer, Corroborator, HttpCountSource, read_answer
from arbiter_testing import (
    GIB,
    FakeDiffusionServer,
    FakeLlmServer,
    FakeModel,
    RecordingServer,
    VramBoard,
    api_fixture,
    wait_until,
)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def source(tmp_path: Path, clock: Clock | None = None, **options: object) -> HttpCountSource:
    opts = HttpCountSource.Options.model_validate({"kind": "http_count", **options})
    if clock is None:
        return HttpCountSource(opts, PluginContext(state_dir=tmp_path))
    return HttpCountSource(opts, PluginContext(state_dir=tmp_path), clock=clock)


@pytest.fixture
def board(tmp_path: Path) -> VramBoard:
    return VramBoard(tmp_path / "gpu.json", 24 * GIB)


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=5, trust_env=False) as c:
        yield c


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- options and parsing -----------------------------------------------------------------


def test_options_are_checked() -> None:
    ok = {"kind": "http_count", "url": "http://127.0.0.1:1/q", "count_keys": ["a.b"]}
    assert HttpCountSource.Options.model_validate(ok).stale_after_s == 90
    for bad, match in (
        ({"url": "ftp://x"}, "http:// or https://"),
        ({"count_keys": []}, "at least 1"),
        ({"count_keys": ["a..b"]}, "dotted field path"),
        ({"stale_after_s": 0}, "greater than 0"),
        ({"surprise": 1}, "Extra inputs"),
    ):
        with pytest.raises(ValidationError, match=match):
            HttpCountSource.Options.model_validate({**ok, **bad})


def test_reads_the_documented_loaded_models_answer() -> None:
    doc = json.loads(api_fixture("llm-server-api/api-ps-response.json").read_text())
    answer = read_answer(doc, ["models"], "models", "name")
    assert answer.count == 1 and answer.models == ("mistral:latest",) and answer.detail == "models 1"
    assert read_answer({"models": []}, ["models"], "models").models == ()


def test_sums_several_lists_and_follows_dotted_paths() -> None:
    doc = {"queue_running": [[1]], "queue_pending": [[2], [3]], "data": {"jobs": ["x"]}, "a.b": [1]}
    assert read_answer(doc, ["queue_running", "queue_pending", "data.jobs", "a.b"]).count == 5
    a, b = read_answer({"q": [1]}, ["q"]), read_answer({"q": [2]}, ["q"])
    assert a.count == b.count and a.fingerprint != b.fingerprint  # what is listed, not only how many


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({}, "has no 'q'"),
        ({"q": 3}, "is int, not a list"),
        ({"q": [], "models": [{"size": 1}]}, "has no 'name'"),
        ({"q": []}, "has no 'models'"),
    ],
)
def test_an_answer_of_another_shape_says_what_is_wrong(doc: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        read_answer(doc, ["q"], "models")


# --- corroboration, with a fake clock ----------------------------------------------------------


def claim(n: int, tag: str = "a") -> Answer:
    return Answer(n, f"{tag}{n}", (), f"q {n}")


def test_a_claim_is_believed_without_a_floor_or_above_it_or_when_vram_cannot_be_read() -> None:
    assert Corroborator(None, 90).judge(claim(1), 0, 0.0)[0] is True
    judge = Corroborator(GIB, 90)
    assert judge.judge(claim(1), 2 * GIB, 0.0) == (True, "1 listed (q 1)")
    busy, why = judge.judge(claim(1), None, 1000.0)
    assert busy is True and "cannot be read" in why
    assert judge.judge(claim(0), 0, 0.0)[0] is False


def test_a_suspect_claim_unchanged_for_stale_after_s_is_stale_and_read_as_idle() -> None:
    judge = Corroborator(GIB, 90)
    busy, why = judge.judge(claim(2), GIB // 2, 0.0)
    assert busy is True and why.startswith("suspect") and "90s more" in why
    assert judge.judge(claim(2), GIB // 2, 89.9)[0] is True
    busy, why = judge.judge(claim(2), GIB // 2, 90.0)
    assert busy is False and why.startswith("stale") and "unchanged for 90s" in why
    # above the floor again, the same old claim is believed: the program holds memory for it
    assert judge.judge(claim(2), 2 * GIB, 91.0)[0] is True
    # a claim that changes starts the wait again
    assert judge.judge(claim(2, "b"), GIB // 2, 150.0)[0] is True
    assert judge.judge(claim(2, "b"), GIB // 2, 239.9)[0] is True
    assert judge.judge(claim(2, "b"), GIB // 2, 240.0)[0] is False


def test_stale_queue_read_through_a_real_server_and_the_tick(tmp_path: Path, client: httpx.Client) -> None:
    stuck = {"queue_running": [[7, "be3a5eff", {}, ["9"], {"create_time": 1}]], "queue_pending": []}
    clock = Clock()
    with RecordingServer(answer=stuck) as server:
        src = source(
            tmp_path, clock, url=f"{server.url}/queue", count_keys=["queue_running", "queue_pending"], vram_floor_gb=1
        )
        src.tenant_vram(GIB // 4)  # the tick hands over the tenant's VRAM
        state = src.probe_once(client)
        assert state.readable and state.busy is True and state.why.startswith("suspect")
        clock.t += 90
        src.tenant_vram(GIB // 4)  # the tick alone can make it stale
        assert src.state().busy is False and src.state().why.startswith("stale")
        assert src.state().changed_at == clock.t
        assert src.probe_once(client).busy is False
        server.answer = {"queue_running": [], "queue_pending": [[8, "x", {}, [], {}]]}
        assert src.probe_once(client).busy is True  # a new claim is believed again at first


# --- against the fake programs -----------------------------------------------------------------


def test_busy_and_models_from_the_llm_servers_loaded_models(tmp_path: Path, board: VramBoard) -> None:
    seen: list[SourceState] = []
    with FakeLlmServer(board, [FakeModel("mistral:latest", 13 * GIB), FakeModel("llama3.2", 2 * GIB)]) as llm:
        src = source(tmp_path, url=f"{llm.url}/api/ps", count_keys=["models"], models_key="models", every_s=60)
        src.start(seen.append)
        try:
            wait_until(lambda: src.state().readable, 5, "the first probe")
            assert src.state().busy is False and src.state().models == ()
            llm.load("mistral:latest")
            llm.load("llama3.2")
            src.refresh()  # a wake-up: read now, not in 60 s
            wait_until(lambda: src.state().busy is True, 5, "the refreshed probe")
            assert set(src.state().models) == {"mistral:latest", "llama3.2"}
            assert [s.busy for s in seen] == [False, True]  # on_change only when it changed
            probes = src.probes
            src.refresh()
            wait_until(lambda: src.probes > probes, 5, "another probe")
            assert len(seen) == 2  # nothing changed: no hand-over
        finally:
            src.close()


def test_busy_from_the_diffusion_servers_queue(tmp_path: Path, board: VramBoard) -> None:
    board.set(9999, 23 * GIB)  # the card is full: its run is starved and stays in the queue
    with FakeDiffusionServer(board, fast_s=0.1, starved_s=60) as diffusion:
        src = source(
            tmp_path, url=f"{diffusion.url}/queue", count_keys=["queue_running", "queue_pending"], every_s=0.05
        )
        src.start(lambda state: None)
        try:
            wait_until(lambda: src.state().busy is False, 5, "an idle reading")
            diffusion.submit()
            diffusion.submit()
            wait_until(lambda: src.state().busy is True, 5, "the queued work")
            wait_until(lambda: "queue_running 1 + queue_pending 1" in src.state().why, 5, "both listed")
            board.set(9999, 0)
            wait_until(lambda: src.state().busy is False, 10, "the queue to empty")
        finally:
            src.close()
    board.remove(9999)


# --- failed probes: unknown, which counts as busy ---------------------------------------------


def test_nobody_listening_is_unknown(tmp_path: Path, client: httpx.Client) -> None:
    src = source(tmp_path, url=f"http://127.0.0.1:{free_port()}/api/ps", count_keys=["models"], models_key="models")
    state = src.probe_once(client)
    assert not state.readable and state.busy is None
    assert "cannot read http://127.0.0.1:" in state.why and "running" in state.why


@pytest.mark.parametrize(
    ("status", "answer", "match"),
    [
        (500, {"error": "boom"}, "answered HTTP 500"),
        (200, b"<html>", "did not answer JSON"),
        (200, {"other": []}, "has no 'models'"),
    ],
)
def test_an_error_answer_is_unknown(
    tmp_path: Path, client: httpx.Client, status: int, answer: object, match: str
) -> None:
    with RecordingServer(status=status, answer=answer) as server:
        src = source(tmp_path, url=f"{server.url}/api/ps", count_keys=["models"])
        state = src.probe_once(client)
        assert not state.readable and state.busy is None and match in state.why


def test_a_slow_answer_times_out_as_unknown_and_keeps_the_last_models(tmp_path: Path) -> None:
    with RecordingServer(answer={"models": [{"name": "m"}]}) as server:
        src = source(tmp_path, url=f"{server.url}/api/ps", count_keys=["models"], models_key="models", timeout_s=0.2)
        with httpx.Client(timeout=0.2, trust_env=False) as client:
            assert src.probe_once(client).models == ("m",)
            server.delay_s = 1.0
            state = src.probe_once(client)
        assert not state.readable and state.busy is None and "within 0.2s" in state.why
        assert state.models == ("m",)  # the names it read last, for a release per model


def test_close_stops_the_thread_promptly(tmp_path: Path) -> None:
    with RecordingServer(answer={"q": []}) as server:
        src = source(tmp_path, url=f"{server.url}/", count_keys=["q"], every_s=3600)
        src.start(lambda state: None)
        wait_until(lambda: src.probes == 1, 5, "the first probe")
        src.close()
        assert not any(
            t.name.startswith("arbiter-http_count") and t.is_alive()
            for t in threading.enumerate()
            if server.url in t.name
        )


def test_a_probe_whose_program_does_not_run_is_not_read_until_it_runs_again(tmp_path: Path) -> None:
    with RecordingServer(answer={"q": [1]}) as server:
        quiet = source(tmp_path, url=f"{server.url}/quiet", count_keys=["q"], every_s=0.02)
        clock = source(tmp_path, url=f"{server.url}/clock", count_keys=["q"], every_s=0.02)
        try:
            quiet.start(lambda state: None)
            clock.start(lambda state: None)
            wait_until(lambda: quiet.state().busy is True, 10, "the first answer")
            quiet.tenant_running(False)
            state = quiet.state()
            assert not state.readable and state.busy is None and "not read while its program does not run" in state.why
            stopped_at = quiet.probes
            # the other probe, at the same pace, is the clock: fifty reads of it and none of this one
            wait_until(lambda: clock.probes >= 50 + stopped_at, 30, "fifty reads of the other probe")
            assert quiet.probes <= stopped_at + 1  # one read already under way may still land
            quiet.tenant_running(True)
            wait_until(lambda: quiet.state().busy is True, 10, "a read once its program runs again")
        finally:
            quiet.close()
            clock.close()
