"""Each shipped rule for a server that says how busy it is, read by its own busy probe (built
by the plugin that runs it, from the shipped file with only base_url moved to the fake's port)
against a fake on 127.0.0.1 that follows that server's documented API: idle, busy while a
request runs, idle again."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from arbiter.config.loader import check_paths, validate_kind_options
from arbiter.plugin import PluginContext
from arbiter.pluginmanager import build_plugin_manager
from arbiter_testing import GIB, VramBoard
from arbiter_testing.fake_llm_servers import FakeLlamaServer, FakeSglangServer, FakeTgiServer
from arbiter_testing.fake_vllm import FakeVllmServer
from arbiter_testing.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


def post(url: str, body: dict[str, Any]) -> None:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    try:
        urllib.request.urlopen(request, timeout=10).read()
    except OSError:
        pass  # a refused request is the test's to check, not this thread's


CASES: dict[str, tuple[Callable[..., Any], str, dict[str, Any]]] = {
    "llama-server": (FakeLlamaServer, "/completion", {"prompt": "hi", "n_predict": 1}),
    "sglang": (FakeSglangServer, "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1}}),
    "tgi": (FakeTgiServer, "/generate", {"inputs": "hi", "parameters": {"max_new_tokens": 1}}),
    "vllm": (FakeVllmServer, "/v1/completions", {"model": "Qwen/Qwen2.5-7B-Instruct", "prompt": "hi", "max_tokens": 1}),
}


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_the_shipped_busy_probe_reads_its_server(rule_id: str, tmp_path: Path) -> None:
    make, path, body = CASES[rule_id]
    board = VramBoard(tmp_path / "vram.json", 24 * GIB)
    host = build_plugin_manager()
    mine = tmp_path / "mine"
    mine.mkdir()
    with make(board, gen_s=1.0) as server, httpx.Client(timeout=5, trust_env=False) as client:
        (mine / "port.yaml").write_text(f"extends: {rule_id}\nbase_url: {server.url}\n")
        ruleset = check_paths([ROOT / "tenants.d", mine], host.options_model, host.kind_names)
        assert not ruleset.problems, ruleset.problems
        block = ruleset.rules[rule_id].busy
        assert block is not None and block.options()["url"].startswith(server.url)
        info = host.kind("sources", block.kind)
        assert info is not None
        probe = info.cls(validate_kind_options(block, info.cls.Options), PluginContext(state_dir=tmp_path))
        try:
            idle = probe.probe_once(client)
            assert idle.readable and idle.busy is False, idle.why
            worker = threading.Thread(target=post, args=(f"{server.url}{path}", body))
            worker.start()
            busy = wait_until(lambda: (s := probe.probe_once(client)).busy and s, 5, "busy while it generates")
            assert "busy when > 0" in busy.why
            worker.join(timeout=10)
            assert probe.probe_once(client).busy is False
        finally:
            probe.close()
    host.close()
