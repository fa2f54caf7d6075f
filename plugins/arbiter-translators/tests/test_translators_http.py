"""``http_post`` (release VRAM, and take it back) against
real HTTP servers on 127.0.0.1: the fake LLM server unloading per model, the fake diffusion
server's ``/free``, and a recording server for errors, timeouts and templates.  Errors are
returned, never raised."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from arbiter.plugin import ActionResult, PluginContext, PluginError
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
from arbiter_translators import HttpPostTranslator, SignalTranslator


def post(tmp_path: Path, **options: object) -> HttpPostTranslator:
    opts = HttpPostTranslator.Options.model_validate({"kind": "http_post", **options})
    return HttpPostTranslator(opts, PluginContext(state_dir=tmp_path))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def board(tmp_path: Path) -> VramBoard:
    return VramBoard(tmp_path / "gpu.json", 24 * GIB)


@pytest.fixture
def llm(board: VramBoard) -> Iterator[FakeLlmServer]:
    models = [FakeModel("mistral:latest", 9 * GIB), FakeModel("llama3.2", 2 * GIB)]
    with FakeLlmServer(board, models, pid=4242) as server:
        yield server


# --- the base class --------------------------------------------------------------------------


def test_a_translator_without_release_or_reacquire_says_so(tmp_path: Path) -> None:
    signal = SignalTranslator(SignalTranslator.Options(), PluginContext(state_dir=tmp_path))
    with pytest.raises(PluginError, match="this translator cannot release"):
        signal.release("llm-server", ["m"])
    with pytest.raises(PluginError, match="cannot bring a tenant back"):
        signal.reacquire("llm-server")
    assert HttpPostTranslator.actions == {"release", "reacquire"}


# --- http_post ----------------------------------------------------------------------------------


def test_options_are_checked() -> None:
    with pytest.raises(ValidationError, match="http:// or https://"):
        HttpPostTranslator.Options.model_validate({"kind": "http_post", "url": "127.0.0.1/free"})
    with pytest.raises(ValidationError, match="must not set 'model'"):
        HttpPostTranslator.Options.model_validate(
            {"kind": "http_post", "url": "http://x/", "per_model": True, "body": {"model": "m"}}
        )
    defaults = HttpPostTranslator.Options.model_validate({"kind": "http_post", "url": "http://x/"})
    assert defaults.confirm is True and defaults.timeout_s == 10 and defaults.per_model is False


def test_per_model_unloads_each_loaded_model_of_the_llm_server(
    tmp_path: Path, llm: FakeLlmServer, board: VramBoard
) -> None:
    llm.load("mistral:latest")
    llm.load("llama3.2")
    assert board.held(4242) == 11 * GIB
    unload = json.loads(api_fixture("llm-server-api/api-generate-unload-request.json").read_text())
    del unload["model"]  # per_model adds each name
    tr = post(tmp_path, url=f"{llm.url}/api/generate", body=unload, per_model=True, timeout_s=5)
    try:
        result = tr.release("llm-server", ["mistral:latest", "llama3.2", "mistral:latest"])
    finally:
        tr.close()
    assert result == ActionResult(requested=("model mistral:latest", "model llama3.2"))
    bodies = [r.body for r in llm.requests("POST", "/api/generate")]
    assert bodies == [{"keep_alive": 0, "model": "mistral:latest"}, {"keep_alive": 0, "model": "llama3.2"}]
    wait_until(lambda: board.held(4242) == 0, 5, "both models to unload")  # what the daemon confirms


def test_per_model_with_nothing_loaded_sends_nothing(tmp_path: Path, llm: FakeLlmServer) -> None:
    tr = post(tmp_path, url=f"{llm.url}/api/generate", body={"keep_alive": 0}, per_model=True)
    result = tr.release("llm-server", [])
    tr.close()
    assert result.ok and result.requested == () and "no model loaded" in result.note
    assert llm.requests("POST") == []


def test_the_unload_queues_behind_the_running_request(tmp_path: Path, llm: FakeLlmServer, board: VramBoard) -> None:
    request = llm.start_request("mistral:latest", seconds=0.5)
    tr = post(tmp_path, url=f"{llm.url}/api/generate", body={"keep_alive": 0}, per_model=True)
    result = tr.release("llm-server", ["mistral:latest"])
    tr.close()
    assert result.ok and board.held(4242) == 9 * GIB, "answered at once; the VRAM falls later"
    request.join(timeout=5)
    wait_until(lambda: board.held(4242) == 0, 5, "the unload once the request finished")


def test_free_on_the_diffusion_server_with_the_documented_body(tmp_path: Path, board: VramBoard) -> None:
    body = json.loads(api_fixture("diffusion-server-api/free-request-body.json").read_text())
    with FakeDiffusionServer(board, pid=5151, loaded=True) as diffusion:
        assert board.held(5151) == 6 * GIB
        tr = post(tmp_path, url=f"{diffusion.url}/free", body=body, timeout_s=2)
        result = tr.release("diffusion-server", ["ignored: not per_model"])
        tr.close()
        assert result == ActionResult(requested=("release",))
        assert [r.body for r in diffusion.requests("POST", "/free")] == [{"unload_models": True, "free_memory": True}]
        wait_until(lambda: board.held(5151) == 0, 5, "the idle server to free its memory")


def test_errors_are_collected_not_raised(tmp_path: Path) -> None:
    nobody = f"http://127.0.0.1:{free_port()}/api/generate"
    tr = post(tmp_path, url=nobody, body={"keep_alive": 0}, per_model=True, timeout_s=2)
    result = tr.release("llm-server", ["a", "b"])
    tr.close()
    assert not result.ok and result.requested == ("model a", "model b") and len(result.errors) == 2
    assert result.errors[0].startswith("model a: cannot reach http://127.0.0.1:") and "running" in result.errors[0]
    with RecordingServer(status=404, answer={"error": "model 'a' not found"}) as server:
        tr = post(tmp_path, url=f"{server.url}/api/generate", per_model=True)
        result = tr.release("llm-server", ["a"])
        tr.close()
    assert result.errors == (
        "model a: POST " + server.url + '/api/generate answered HTTP 404: {"error": "model \'a\' not found"}',
    )


def test_timeout_s_bounds_the_whole_release(tmp_path: Path) -> None:
    with RecordingServer(delay_s=0.6) as server:
        tr = post(tmp_path, url=f"{server.url}/free", per_model=True, timeout_s=0.3)
        started = time.monotonic()
        result = tr.release("slow", ["a", "b", "c"])
        took = time.monotonic() - started
        tr.close()
    assert not result.ok and "did not answer within 0.3s" in result.errors[0]
    assert any("were used up" in e for e in result.errors[1:]) or len(result.errors) == 3
    assert took < 0.3 + 1.0, "not three full timeouts one after another"


def test_http_post_sends_its_request_to_bring_a_tenant_back(tmp_path: Path) -> None:
    from arbiter_testing import RecordingServer

    with RecordingServer() as server:
        block = {"kind": "http_post", "url": f"{server.url}/wake_up", "timeout_s": 5}
        wake = HttpPostTranslator(HttpPostTranslator.Options.model_validate(block), PluginContext(state_dir=tmp_path))
        try:
            result = wake.reacquire("vllm")
        finally:
            wake.close()
        assert result.requested == ("reacquire",) and not result.errors
        assert [s.path for s in server.requests("POST")] == ["/wake_up"]
        server.status = 500
        wake = HttpPostTranslator(HttpPostTranslator.Options.model_validate(block), PluginContext(state_dir=tmp_path))
        try:
            failed = wake.reacquire("vllm")
        finally:
            wake.close()
        assert failed.errors and "HTTP 500" in failed.errors[0]


def test_steps_go_before_and_after_its_own_request_and_a_failure_undoes_the_drain(tmp_path: Path) -> None:
    with RecordingServer() as server:
        steps = {
            "before": [{"url": f"{server.url}/pause", "body": {"mode": "retract"}}],
            "after": [{"url": f"{server.url}/go_on"}],
            "if_failed": [{"url": f"{server.url}/go_on_anyway"}],
        }
        tr = post(tmp_path, url=f"{server.url}/release", timeout_s=5, **steps)
        try:
            done = tr.release("sglang")
            assert done.ok and done.requested == (
                f"release step {server.url}/pause",
                "release",
                f"release step {server.url}/go_on",
            )
            assert [(s.path, s.body) for s in server.requests("POST")] == [
                ("/pause", {"mode": "retract"}),
                ("/release", {}),
                ("/go_on", {}),
            ]
            server.status = 500  # the drain step itself fails: nothing else but its undo is sent
            failed = tr.release("sglang")
            assert not failed.ok and "HTTP 500" in failed.errors[0]
            assert [s.path for s in server.requests("POST")][3:] == ["/pause", "/go_on_anyway"]
        finally:
            tr.close()


def test_a_step_must_be_a_url_and_a_body(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="url must start with http"):
        post(tmp_path, url="http://127.0.0.1:1/r", before=[{"url": "pause"}])
    with pytest.raises(ValidationError, match="Extra inputs"):
        post(tmp_path, url="http://127.0.0.1:1/r", before=[{"url": "http://127.0.0.1:1/p", "mode": "retract"}])
