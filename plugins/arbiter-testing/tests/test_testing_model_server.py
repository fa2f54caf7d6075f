"""The model server, holding its memory on a VRAM board (no GPU here), answering the local
LLM server's documented API as its fixtures show it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from arbiter_testing import api_fixture
from arbiter_testing.model_server import GIB, BoardMemory, ModelServer
from arbiter_testing.vram_board import VramBoard


def test_it_loads_and_unloads_as_the_documented_api_says(tmp_path: Path) -> None:
    board_path = tmp_path / "board.json"
    server = ModelServer(BoardMemory(str(board_path)), {"llama3.2": 2 * GIB}).start()
    try:
        board = VramBoard(board_path)
        load = json.loads(api_fixture("llm-server-api/api-generate-load-request.json").read_text())
        answer = httpx.post(f"{server.url}/api/generate", json=load).json()
        shape = json.loads(api_fixture("llm-server-api/api-generate-load-response.json").read_text())
        assert set(shape) <= set(answer) and answer["done"] is True
        assert board.held(os.getpid()) == 2 * GIB
        ps = httpx.get(f"{server.url}/api/ps").json()
        documented = json.loads(api_fixture("llm-server-api/api-ps-response.json").read_text())["models"][0]
        (model,) = ps["models"]
        assert {"name", "model", "size", "size_vram"} <= set(model) <= set(documented)
        assert model["name"] == "llama3.2" and model["size_vram"] == 2 * GIB
        unload = json.loads(api_fixture("llm-server-api/api-generate-unload-request.json").read_text())
        answer = httpx.post(f"{server.url}/api/generate", json=unload).json()
        assert answer["done_reason"] == "unload"
        assert board.held(os.getpid()) == 0 and httpx.get(f"{server.url}/api/ps").json() == {"models": []}
        assert [u["model"] for u in httpx.get(f"{server.url}/debug/unloads").json()] == ["llama3.2"]
        assert httpx.post(f"{server.url}/api/generate", json={"model": "other"}).status_code == 404
    finally:
        server.close()


def test_it_runs_as_a_program_and_says_where(tmp_path: Path) -> None:
    board_path = tmp_path / "board.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "arbiter_testing.model_server", "--gib", "1", "--board", str(board_path), "--load"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        said = json.loads(proc.stdout.readline())
        assert said["pid"] == proc.pid
        assert VramBoard(board_path).held(proc.pid) == GIB
        assert httpx.get(f"{said['url']}/api/ps").json()["models"][0]["name"] == "weights:latest"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
