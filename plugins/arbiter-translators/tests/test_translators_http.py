"""``http_post`` (release VRAM) and ``http_knob`` (a duty as a program's own setting) against
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
from arbiter_translators import HttpKnobTranslator, HttpPostTranslator, SignalTranslator


def post(tmp_path: Path, **options: object) -> HttpPostTranslator:
    opts = HttpPostTranslator.Options.model_validate({"kind": "http_post", **options})
    return HttpPostTranslator(opts, PluginContext(state_dir=tmp_path))


def knob(tmp_path: Path, **options: object) -> HttpKnobTranslator:
    opts = HttpKnobTranslator.Options.model_validate({"kind": "http_knob", **options})
    return HttpKnobTranslator(opts, PluginContext(state_dir=tmp_path))


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


def test_a_translator_without_release_or_duty_says_so(tmp_path: Path) -> None:
    signal = SignalTranslator(SignalTranslator.Options(), PluginContext(state_dir=tmp_path))
    with pytest.raises(PluginError, match="this translator cannot release"):
        signal.release("llm-server", ["m"])
    with pytest.raises(PluginError, match="cannot set a duty"):
        signal.set_duty("llm-server", 0.5)
    with pytest.raises(PluginError, match="cannot bring a tenant back"):
        signal.reacquire("llm-server")
    assert HttpPostTranslator.actions == {"release", "reacquire"} and HttpKnobTranslator.actions == {"duty"}


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


# --- http_knob ----------------------------------------------------------------------------------


def test_knob_options_are_checked() -> None:
    base = {"kind": "http_knob", "url": "http://127.0.0.1:1/set"}
    for bad, match in (
        ({"levels": {0.5: 4}}, "must include 0"),
        ({"levels": {0: 1, 1.5: 4}}, "from 0 to 1"),
        ({"levels": {}}, "is empty"),
        ({"method": "GET", "body": {"a": 1}}, "sends no body"),
        ({"method": "DELETE"}, "method"),
    ):
        with pytest.raises(ValidationError, match=match):
            HttpKnobTranslator.Options.model_validate({**base, **bad})


def test_a_duty_becomes_the_level_value_in_a_templated_request(tmp_path: Path) -> None:
    with RecordingServer(answer={"ok": True}) as server:
        tr = knob(
            tmp_path,
            url=f"{server.url}/config/{{value}}?d={{duty}}",
            method="PUT",
            body={"batch_size": "{value}", "note": "duty {duty} → batch {value}", "fixed": [1, "{x}"]},
            levels={0: 1, 0.25: 4, 0.5: 8, 1: 16},
        )
        result = tr.set_duty("embedder", 0.6)
        assert result.ok and result.requested == (f"PUT {server.url}/config/8?d=0.6 value 8 (duty 0.60)",)
        (seen,) = server.requests("PUT")
        assert seen.path == "/config/8?d=0.6"
        assert seen.body == {"batch_size": 8, "note": "duty 0.6 → batch 8", "fixed": [1, "{x}"]}
        # {duty} is in this request, so another duty is another request, even at the same value
        assert tr.set_duty("embedder", 0.7).requested != ()
        tr.close()


def test_a_duty_that_maps_to_the_value_already_set_sends_nothing(tmp_path: Path) -> None:
    with RecordingServer() as server:
        tr = knob(tmp_path, url=f"{server.url}/config", body={"batch_size": "{value}"}, levels={0: 1, 0.5: 8})
        assert tr.set_duty("embedder", 0.6).ok
        again = tr.set_duty("embedder", 0.7)
        assert again.ok and again.requested == () and "already has value 8" in again.note
        assert tr.set_duty("embedder", 0.1).ok
        assert [s.body["batch_size"] for s in server.requests("POST")] == [8, 1]
        tr.close()


def test_without_levels_the_value_is_the_duty(tmp_path: Path) -> None:
    with RecordingServer() as server:
        tr = knob(tmp_path, url=f"{server.url}/limit", body={"gpu_share": "{value}"})
        assert tr.set_duty("t", 0.35).ok
        tr.close()
        assert server.requests("POST")[0].body == {"gpu_share": 0.35}


def test_a_failed_knob_is_returned_and_sent_again_next_time(tmp_path: Path) -> None:
    with RecordingServer(status=500, answer={"error": "no"}) as server:
        tr = knob(tmp_path, url=f"{server.url}/set", body={"v": "{value}"}, levels={0: 1, 0.5: 2})
        failed = tr.set_duty("t", 0.5)
        assert not failed.ok and "answered HTTP 500" in failed.errors[0]
        server.status = 200
        assert tr.set_duty("t", 0.5).ok
        assert len(server.requests("POST")) == 2
        tr.close()
    gone = knob(tmp_path, url=f"http://127.0.0.1:{free_port()}/set", timeout_s=1)
    result = gone.set_duty("t", 0.5)
    gone.close()
    assert not result.ok and "cannot reach" in result.errors[0]
    out_of_range = knob(tmp_path, url="http://127.0.0.1:1/set").set_duty("t", 1.5)
    assert not out_of_range.ok and "not between 0 and 1" in out_of_range.errors[0]


def test_a_get_knob_puts_the_value_in_the_url_quoted(tmp_path: Path) -> None:
    with RecordingServer() as server:
        tr = knob(tmp_path, url=f"{server.url}/rate?limit={{value}}", method="GET", levels={0: "0 per s", 1: "all"})
        assert tr.set_duty("t", 0.2).ok
        tr.close()
        assert server.requests("GET")[0].path == "/rate?limit=0%20per%20s"


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
