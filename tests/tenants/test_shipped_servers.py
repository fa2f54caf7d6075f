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
from arbiter.plugin import PluginContext, SourceState
from arbiter.pluginmanager import build_plugin_manager
from arbiter_sources.http_count import HttpProbe
from arbiter_testing import GIB, VramBoard
from arbiter_testing.fake_llm_servers import FakeLlamaServer, FakeSglangServer, FakeTgiServer
from arbiter_testing.fake_model_swappers import FakeLlamaSwap, FakeLocalAI
from arbiter_testing.fake_vllm import FakeVllmServer
from arbiter_testing.waiting import wait_until
from arbiter_translators.http import HttpPostTranslator

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
        assert info is not None and issubclass(info.cls, HttpProbe)
        probe = info.cls(validate_kind_options(block, info.cls.Options), PluginContext(state_dir=tmp_path))
        try:
            idle = probe.probe_once(client)
            assert idle.readable and idle.busy is False, idle.why
            worker = threading.Thread(target=post, args=(f"{server.url}{path}", body))
            worker.start()

            def busy_state() -> SourceState | None:
                state = probe.probe_once(client)
                return state if state.busy else None

            busy = wait_until(busy_state, 5, "busy while it generates")
            assert "busy when > 0" in busy.why
            worker.join(timeout=10)
            assert probe.probe_once(client).busy is False
        finally:
            probe.close()
    host.close()


# Servers that list their loaded models, not their running requests: busy while a model is
# loaded, and the shipped release (built by its plugin from the shipped file) unloads them.
SWAPPERS: dict[str, tuple[Callable[..., Any], str]] = {
    "llama-swap": (FakeLlamaSwap, "/api/models/unload"),
    "localai": (FakeLocalAI, "/backend/shutdown"),
}


@pytest.mark.parametrize("rule_id", sorted(SWAPPERS))
def test_the_shipped_rule_reads_loaded_models_and_unloads_them(rule_id: str, tmp_path: Path) -> None:
    make, release_path = SWAPPERS[rule_id]
    board = VramBoard(tmp_path / "vram.json", 24 * GIB)
    host = build_plugin_manager()
    mine = tmp_path / "mine"
    mine.mkdir()
    with make(board, gen_s=0.2) as server, httpx.Client(timeout=5, trust_env=False) as client:
        (mine / "port.yaml").write_text(f"extends: {rule_id}\nbase_url: {server.url}\n")
        ruleset = check_paths([ROOT / "tenants.d", mine], host.options_model, host.kind_names)
        assert not ruleset.problems, ruleset.problems
        rule = ruleset.rules[rule_id]
        assert rule.busy is not None and rule.release is not None
        source = host.kind("sources", rule.busy.kind)
        translator = host.kind("translators", rule.release.kind)
        assert source is not None and issubclass(source.cls, HttpProbe)
        assert translator is not None and issubclass(translator.cls, HttpPostTranslator)
        ctx = PluginContext(state_dir=tmp_path)
        probe = source.cls(validate_kind_options(rule.busy, source.cls.Options), ctx)
        release = translator.cls(validate_kind_options(rule.release, translator.cls.Options), ctx)
        try:
            idle = probe.probe_once(client)
            assert idle.readable and idle.busy is False and idle.models == (), idle.why
            if rule_id == "localai":  # a release per model: nothing loaded, nothing sent
                assert "nothing to release" in release.release(rule_id, idle.models).note
                assert not server.requests("POST", release_path)
            for model in ("qwen2.5-7b", "llama-3.2-3b"):
                post(
                    f"{server.url}/v1/chat/completions",
                    {"model": model, "messages": [{"role": "user", "content": "hi"}]},
                )
            loaded = probe.probe_once(client)
            assert loaded.readable and loaded.busy is True, loaded.why
            # llama-swap keeps one model (the second request swapped the first out); LocalAI both
            expected = {"llama-3.2-3b"} if rule_id == "llama-swap" else {"qwen2.5-7b", "llama-3.2-3b"}
            assert set(loaded.models) == expected
            assert board.held(server.pid) == (9 if rule_id == "localai" else 3) * GIB
            result = release.release(rule_id, loaded.models)
            assert not result.errors, result.errors
            sent = server.requests("POST", release_path)
            assert len(sent) == (1 if rule_id == "llama-swap" else 2)
            if rule_id == "localai":
                assert {s.body["model"] for s in sent} == expected
            after = probe.probe_once(client)
            assert after.readable and after.busy is False and after.models == (), after.why
            assert board.held(server.pid) == 0
        finally:
            probe.close()
            release.close()
    host.close()
