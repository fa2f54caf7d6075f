"""The fake LLM and diffusion servers: answers shaped exactly like the real programs'
documented ones, unloads applied only after running work, VRAM written where the ``fake``
reader reads it, and runs that are slow while starved of VRAM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from arbiter.plugin import PluginContext
from arbiter_testing import (
    GIB,
    FakeDiffusionServer,
    FakeLlmServer,
    FakeModel,
    FakeReader,
    RecordingServer,
    VramBoard,
    api_fixture,
    wait_until,
)

MODEL = "mistral:latest"


def fixture_json(name: str) -> Any:
    return json.loads(api_fixture(name).read_text())


def shape(value: Any) -> Any:
    """The keys and value types of a JSON document, for comparing shapes rather than values."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


@pytest.fixture
def board(tmp_path: Path) -> VramBoard:
    return VramBoard(tmp_path / "gpu.json", 24 * GIB)


@pytest.fixture
def llm(board: VramBoard) -> Iterator[FakeLlmServer]:
    with FakeLlmServer(board, [FakeModel(MODEL, 13 * GIB), FakeModel("llama3.2", 2 * GIB)], pid=4242) as server:
        yield server


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10, trust_env=False) as c:
        yield c


def reader(board: VramBoard) -> FakeReader:
    options = FakeReader.Options.model_validate({"kind": "fake", "state_file": str(board.path)})
    return FakeReader(options, PluginContext(state_dir=board.path.parent))


# --- the LLM server ----------------------------------------------------------------------


def test_ps_lists_loaded_models_shaped_like_the_documented_answer(llm: FakeLlmServer, client: httpx.Client) -> None:
    assert client.get(f"{llm.url}/api/ps").json() == {"models": []}
    llm.load(MODEL)
    answer = client.get(f"{llm.url}/api/ps").json()
    assert shape(answer) == shape(fixture_json("llm-server-api/api-ps-response.json"))
    entry = answer["models"][0]
    assert entry["name"] == entry["model"] == MODEL
    assert entry["size_vram"] == entry["size"] == 13 * GIB
    assert len(entry["digest"]) == 64


def test_empty_prompt_loads_and_answers_like_the_documented_load(llm: FakeLlmServer, client: httpx.Client) -> None:
    request = fixture_json("llm-server-api/api-generate-load-request.json")
    request["model"] = MODEL
    answer = client.post(f"{llm.url}/api/generate", json=request).json()
    assert shape(answer) == shape(fixture_json("llm-server-api/api-generate-load-response.json"))
    assert llm.loaded() == [MODEL]


def test_unload_answers_like_the_documented_unload_and_frees_the_vram(
    llm: FakeLlmServer, board: VramBoard, client: httpx.Client
) -> None:
    llm.load(MODEL)
    assert board.held(4242) == 13 * GIB and board.free_bytes() == 11 * GIB
    request = fixture_json("llm-server-api/api-generate-unload-request.json")
    request["model"] = MODEL
    answer = client.post(f"{llm.url}/api/generate", json=request).json()
    expected = fixture_json("llm-server-api/api-generate-unload-response.json")
    assert shape(answer) == shape(expected)
    assert answer["done_reason"] == "unload" and answer["done"] is True and answer["model"] == MODEL
    wait_until(lambda: board.held(4242) == 0, 5, "the unload to free the VRAM")
    assert llm.loaded() == [] and board.free_bytes() == 24 * GIB


def test_unload_is_applied_only_after_the_running_request_finishes(
    llm: FakeLlmServer, board: VramBoard, client: httpx.Client
) -> None:
    request = llm.start_request(MODEL, seconds=1.0)
    asked = time.monotonic()
    answer = client.post(f"{llm.url}/api/generate", json={"model": MODEL, "keep_alive": 0}).json()
    assert answer["done_reason"] == "unload"
    # the answer came while the request still runs, and the model is still loaded
    assert llm.running(MODEL) == 1 and llm.loaded() == [MODEL] and board.held(4242) == 13 * GIB
    request.join(timeout=10)
    wait_until(lambda: board.held(4242) == 0, 5, "the unload after the request")
    (unload,) = llm.unloads
    assert unload.model == MODEL and unload.started_at >= unload.asked_at
    assert unload.started_at - asked >= 0.5, "it waited for the running request"


def test_a_new_request_before_the_unload_starts_calls_it_off(llm: FakeLlmServer) -> None:
    first = llm.start_request(MODEL, seconds=0.3)
    llm.unload(MODEL)
    second = llm.start_request(MODEL, seconds=0.05)  # keep_alive reset by the new request
    first.join(timeout=5)
    second.join(timeout=5)
    assert llm.loaded() == [MODEL] and llm.unloads == []


def test_unknown_model_and_missing_model_are_errors_like_the_real_server(
    llm: FakeLlmServer, client: httpx.Client
) -> None:
    missing = client.post(f"{llm.url}/api/generate", json={"prompt": "hi"})
    assert missing.status_code == 400 and "model is required" in missing.json()["error"]
    unknown = client.post(f"{llm.url}/api/generate", json={"model": "nope", "keep_alive": 0})
    assert unknown.status_code == 404 and "not found" in unknown.json()["error"]


def test_the_fake_reader_reads_what_the_llm_server_writes(llm: FakeLlmServer, board: VramBoard) -> None:
    r = reader(board)
    assert r.read([4242]).processes[4242].vram_bytes == 0
    llm.load(MODEL)
    reading = r.read([4242])
    assert reading.processes[4242].vram_bytes == 13 * GIB
    assert reading.vram_total_bytes == 24 * GIB and reading.vram_free_bytes == 11 * GIB


def test_a_generate_with_a_prompt_runs_and_counts_as_working(
    llm: FakeLlmServer, board: VramBoard, client: httpx.Client
) -> None:
    llm.generate_s = 0.3
    done: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: done.update(
            client.post(f"{llm.url}/api/generate", json={"model": MODEL, "prompt": "hello", "stream": False}).json()
        )
    )
    thread.start()
    wait_until(lambda: llm.running(MODEL) == 1, 5, "the request to run")
    entry = json.loads(board.path.read_text())["processes"]["4242"]
    assert entry["busy_share"] > 0 and entry["vram_bytes"] == 13 * GIB
    thread.join(timeout=5)
    assert done["done"] is True and done["done_reason"] == "stop"
    assert json.loads(board.path.read_text())["processes"]["4242"]["busy_share"] == 0


def test_two_fakes_share_one_board(board: VramBoard) -> None:
    with (
        FakeLlmServer(board, [FakeModel("a", 3 * GIB)], pid=1) as one,
        FakeLlmServer(board, [FakeModel("b", 5 * GIB)], pid=2) as two,
    ):
        one.load("a")
        two.load("b")
        assert board.free_bytes() == 16 * GIB
        doc = json.loads(board.path.read_text())
        assert doc["vram_free_bytes"] == 16 * GIB and set(doc["processes"]) == {"1", "2"}
    assert json.loads(board.path.read_text())["processes"] == {}  # a stopped fake holds nothing


# --- the diffusion server ------------------------------------------------------------------


@pytest.fixture
def diffusion(board: VramBoard) -> Iterator[FakeDiffusionServer]:
    with FakeDiffusionServer(
        board, model_bytes=6 * GIB, needs_bytes=12 * GIB, fast_s=0.2, starved_s=2.0, pid=5151
    ) as server:
        yield server


def test_queue_is_shaped_like_the_schema(
    diffusion: FakeDiffusionServer, board: VramBoard, client: httpx.Client
) -> None:
    assert client.get(f"{diffusion.url}/queue").json() == {"queue_running": [], "queue_pending": []}
    diffusion.starved_s = 60.0
    board.set(9999, 20 * GIB)  # something else holds the card: the run is starved and stays running
    first = client.post(f"{diffusion.url}/prompt", json={"prompt": {"3": {"class_type": "KSampler"}}}).json()
    second = client.post(f"{diffusion.url}/prompt", json={"prompt": {"3": {"class_type": "KSampler"}}}).json()
    assert set(first) == {"prompt_id", "number", "node_errors"} and second["number"] == first["number"] + 1
    wait_until(lambda: bool(client.get(f"{diffusion.url}/queue").json()["queue_running"]), 5, "a running prompt")
    queue = client.get(f"{diffusion.url}/queue").json()
    (running,) = queue["queue_running"]
    # a local ComfyUI's PromptQueue item: [number, prompt_id, prompt, extra_data, outputs_to_execute]
    # (Comfy Cloud's documented schema puts the outputs before the metadata)
    assert [type(x).__name__ for x in running] == ["int", "str", "dict", "dict", "list"]
    assert running[1] == first["prompt_id"] and "create_time" in running[3]
    assert [item[1] for item in queue["queue_pending"]] == [second["prompt_id"]]
    board.remove(9999)


def test_prompt_without_a_prompt_is_refused(diffusion: FakeDiffusionServer, client: httpx.Client) -> None:
    answer = client.post(f"{diffusion.url}/prompt", json={})
    assert answer.status_code == 400 and answer.json()["error"]["type"] == "no_prompt"


def test_websocket_sends_status_and_a_runs_messages_like_a_real_run(diffusion: FakeDiffusionServer) -> None:
    real = [
        json.loads(line)
        for line in api_fixture("diffusion-server-api/ws-messages-sd3-run.jsonl").read_text().splitlines()
    ]
    with connect(diffusion.ws_url, proxy=None) as ws:
        hello = json.loads(ws.recv(timeout=5))
        assert hello["type"] == "status" and "sid" in hello["data"]
        assert hello["data"]["status"]["exec_info"]["queue_remaining"] == 0
        diffusion.submit()
        seen: list[dict[str, Any]] = []
        while not (seen and seen[-1]["type"] == "executing" and seen[-1]["data"]["node"] is None):
            seen.append(json.loads(ws.recv(timeout=5)))
    first_of_each: dict[str, dict[str, Any]] = {}
    for m in seen:
        first_of_each.setdefault(m["type"], m)
    for message in real:  # every kind of message the real run sent, with the same shape
        ours = first_of_each[message["type"]]
        if message["type"] == "status":
            assert shape(ours) == shape(message)
        else:
            assert set(ours["data"]) == set(message["data"]), message["type"]
    order = [m["type"] for m in seen]
    assert order.index("execution_start") < order.index("progress") < order.index("executed")
    progress = [m["data"]["value"] for m in seen if m["type"] == "progress"]
    assert progress == sorted(progress) and progress[-1] == 30


def test_free_applies_between_prompts_and_needs_the_flags(
    diffusion: FakeDiffusionServer, board: VramBoard, client: httpx.Client
) -> None:
    diffusion.starved_s = 60.0  # held starved, the run cannot end before the test lets it
    board.set(7777, 20 * GIB)
    diffusion.submit()
    wait_until(lambda: diffusion.held_bytes() == 4 * GIB, 5, "the run to take what is free")
    body = json.loads(api_fixture("diffusion-server-api/free-request-body.json").read_text())
    answer = client.post(f"{diffusion.url}/free", json=body)
    assert answer.status_code == 200 and answer.content == b""
    assert board.held(5151) == 4 * GIB and diffusion.runs == []  # the running prompt keeps its memory
    asked = time.monotonic()
    board.set(7777, 0)  # the run gets its memory and ends
    wait_until(lambda: board.held(5151) == 0, 10, "/free after the prompt")
    (run,) = diffusion.runs
    assert run.done_at >= asked and diffusion.frees[0][1] >= run.done_at
    # both flags default to false: an empty body frees nothing
    diffusion.submit()
    wait_until(lambda: len(diffusion.runs) == 2, 10, "the second run")
    client.post(f"{diffusion.url}/free", json={})
    assert diffusion.held_bytes() == 6 * GIB and len(diffusion.frees) == 1
    board.remove(7777)


def test_a_run_is_slow_while_starved_and_fast_once_it_gets_the_memory(
    diffusion: FakeDiffusionServer, board: VramBoard
) -> None:
    board.set(7777, 13 * GIB)  # an LLM server holding 13 GB of the 24
    diffusion.submit()
    wait_until(lambda: diffusion.held_bytes() > 0, 5, "the run to start")
    assert diffusion.held_bytes() == 11 * GIB  # squeezed into what is free
    time.sleep(0.1)  # part of the run goes at the starved speed (simulated time, not an assertion)
    board.set(7777, 0)  # the memory comes back
    wait_until(lambda: len(diffusion.runs) == 1, 5, "the run to finish")
    run = diffusion.runs[0]
    assert 0.05 <= run.starved_s < run.took_s
    assert run.took_s < 1.5, "once the memory came, the rest went at the full speed (starved: 2 s)"
    assert diffusion.held_bytes() == 6 * GIB  # the model stays loaded, the working memory goes
    board.remove(7777)


def test_drop_websockets_closes_every_client(diffusion: FakeDiffusionServer) -> None:
    with connect(diffusion.ws_url, proxy=None) as ws:
        ws.recv(timeout=5)
        wait_until(lambda: diffusion.ws_clients() == 1, 5, "the client to register")
        diffusion.drop_websockets()
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=5)
    wait_until(lambda: diffusion.ws_clients() == 0, 5, "the client to go")


# --- the recording server and running as a process ----------------------------------------


def test_recording_server_records_and_answers_as_scripted(client: httpx.Client) -> None:
    with RecordingServer(status=503, answer={"error": "busy"}) as server:
        answer = client.put(f"{server.url}/config?x=1", json={"batch": 4})
        assert answer.status_code == 503 and answer.json() == {"error": "busy"}
        (seen,) = server.requests("PUT")
        assert seen.path == "/config?x=1" and seen.body == {"batch": 4}


def test_runs_as_its_own_process(tmp_path: Path, client: httpx.Client) -> None:
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "arbiter_testing.fake_servers",
            "llm",
            "--state-file",
            str(tmp_path / "gpu.json"),
            "--ready-file",
            str(ready),
            "--model",
            "mistral:latest=13",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until(ready.exists, 20, "the fake to write its ready file")
        info = json.loads(ready.read_text())
        assert info["pid"] == proc.pid
        client.post(f"{info['url']}/api/generate", json={"model": "mistral:latest"})
        doc = json.loads((tmp_path / "gpu.json").read_text())
        assert doc["processes"][str(proc.pid)]["vram_bytes"] == 13 * GIB
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
        assert proc.stderr is not None
        proc.stderr.close()
    assert json.loads((tmp_path / "gpu.json").read_text())["processes"] == {}
    assert not os.path.exists(f"/proc/{proc.pid}/status") or proc.returncode is not None
