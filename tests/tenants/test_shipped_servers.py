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
from arbiter.config.models import KindBlock
from arbiter.plugin import PluginContext, SourceState
from arbiter.pluginmanager import build_plugin_manager
from arbiter_sources.http_count import HttpCountSource, HttpProbe
from arbiter_sources.http_value import HttpValueSource
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
            assert "busy when > 0" in busy.why or "busy when any does" in busy.why
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


def shipped(rule_id: str, base_url: str, tmp_path: Path, **more: Any) -> Any:
    """The shipped rule ``rule_id`` with only its base_url moved (and ``more`` fields set)."""
    host = build_plugin_manager()
    mine = tmp_path / "mine"
    mine.mkdir(exist_ok=True)
    extra = "".join(f"{k}: {json.dumps(v)}\n" for k, v in more.items())
    (mine / "port.yaml").write_text(f"extends: {rule_id}\nbase_url: {base_url}\n{extra}")
    ruleset = check_paths([ROOT / "tenants.d", mine], host.options_model, host.kind_names)
    assert not ruleset.problems, ruleset.problems
    host.close()
    return ruleset.rules[rule_id]


def test_localai_refuses_a_busy_shutdown_after_its_grace_and_the_shipped_release_outlasts_it(tmp_path: Path) -> None:
    board = VramBoard(tmp_path / "vram.json", 24 * GIB)
    with FakeLocalAI(board, gen_s=3.0, busy_grace_s=0.3) as server:
        rule = shipped("localai", server.url, tmp_path)
        assert rule.release is not None and rule.release.options()["timeout_s"] > 30  # its real grace
        release = HttpPostTranslator(
            validate_kind_options(rule.release, HttpPostTranslator.Options), PluginContext(state_dir=tmp_path)
        )
        worker = threading.Thread(
            target=post, args=(f"{server.url}/v1/chat/completions", {"model": "qwen2.5-7b", "messages": []})
        )
        worker.start()
        wait_until(lambda: server.loaded.get("qwen2.5-7b"), 5, "the request running")
        refused = release.release("localai", ("qwen2.5-7b",))
        assert refused.errors and "HTTP 500" in refused.errors[0]
        assert "qwen2.5-7b" in server.loaded  # nothing freed, nothing broken
        worker.join(timeout=10)
        assert not release.release("localai", ("qwen2.5-7b",)).errors
        assert board.held(server.pid) == 0
        release.close()


def test_llama_swap_reads_busy_while_a_model_starts(tmp_path: Path) -> None:
    board = VramBoard(tmp_path / "vram.json", 24 * GIB)
    with FakeLlamaSwap(board, load_s=2.0, gen_s=0.1) as server, httpx.Client(timeout=5, trust_env=False) as client:
        rule = shipped("llama-swap", server.url, tmp_path)
        assert rule.busy is not None
        probe = HttpCountSource(
            validate_kind_options(rule.busy, HttpCountSource.Options), PluginContext(state_dir=tmp_path)
        )
        worker = threading.Thread(
            target=post, args=(f"{server.url}/v1/chat/completions", {"model": "qwen2.5-7b", "messages": []})
        )
        worker.start()
        wait_until(lambda: server.starting, 5, "the model starting")
        starting = probe.probe_once(client)
        assert starting.busy is True and starting.models == ("qwen2.5-7b",), starting.why
        worker.join(timeout=10)
        probe.close()


def test_with_an_api_key_the_release_is_refused_401_and_sent_with_the_key_from_a_file(tmp_path: Path) -> None:
    board = VramBoard(tmp_path / "vram.json", 24 * GIB)
    key = tmp_path / "sglang.auth"
    key.write_text("Bearer s3cret\n")
    key.chmod(0o600)
    with FakeSglangServer(board) as server:
        server.api_key = "s3cret"
        rule = shipped("sglang", server.url, tmp_path)
        assert rule.release is not None
        ctx = PluginContext(state_dir=tmp_path)
        bare = HttpPostTranslator(validate_kind_options(rule.release, HttpPostTranslator.Options), ctx)
        refused = bare.release("sglang", ())
        assert refused.errors and "HTTP 401" in refused.errors[0]
        assert not server.released
        block = KindBlock(
            kind=rule.release.kind, **{**rule.release.options(), "headers": {"Authorization": {"from_file": str(key)}}}
        )
        keyed = HttpPostTranslator(validate_kind_options(block, HttpPostTranslator.Options), ctx)
        assert not keyed.release("sglang", ()).errors
        assert server.released
        bare.close()
        keyed.close()


def test_llama_server_in_router_mode_reads_unknown_and_the_documented_extension_reads_and_unloads(
    tmp_path: Path,
) -> None:
    board = VramBoard(tmp_path / "vram.json", 24 * GIB)
    ctx = PluginContext(state_dir=tmp_path)
    with FakeLlamaServer(board, router=True, gen_s=1.0) as server, httpx.Client(timeout=5, trust_env=False) as client:
        plain = shipped("llama-server", server.url, tmp_path)
        assert plain.busy is not None
        probe = HttpValueSource(validate_kind_options(plain.busy, HttpValueSource.Options), ctx)
        unknown = probe.probe_once(client)
        assert not unknown.readable and unknown.busy is None and "HTTP 400" in unknown.why
        probe.close()
        # what the rule's comment says to write for a router serving one model
        model = FakeLlamaServer.ROUTER_MODEL
        router = shipped(
            "llama-server",
            server.url,
            tmp_path,
            busy={"url": f"/slots?model={model}"},
            release={"kind": "http_post", "url": "/models/unload", "body": {"model": model}, "timeout_s": 30},
        )
        assert router.busy is not None and router.release is not None
        probe = HttpValueSource(validate_kind_options(router.busy, HttpValueSource.Options), ctx)
        release = HttpPostTranslator(validate_kind_options(router.release, HttpPostTranslator.Options), ctx)
        worker = threading.Thread(target=post, args=(f"{server.url}/completion", {"model": model, "prompt": "hi"}))
        worker.start()

        def busy_state() -> SourceState | None:
            state = probe.probe_once(client)
            return state if state.busy else None

        assert wait_until(busy_state, 5, "busy while it generates").readable
        worker.join(timeout=10)
        assert probe.probe_once(client).busy is False
        assert board.held(server.pid) == 8 * GIB
        assert not release.release("llama-server", ()).errors
        assert board.held(server.pid) < GIB
        probe.close()
        release.close()
