"""The shipped rules of the servers that load models on demand or cannot release, each
through a real daemon against its fake (which follows that server's source: see each
fake's docstring), used through ``extends:`` with only base_url, match and what the rule's
comments say to change: idle and busy, released for a render short of VRAM and back.

- TGI publishes no gauge before its first request: read idle from the start, not unknown.
- llama-server is read through ``/slots``: a poll by arbiter leaves the throughput the
  user's own Prometheus scrapes from ``/metrics`` as it was; in router mode the plain rule
  reads unknown (HTTP 400) and the documented extension reads and unloads its model; with
  ``--api-key`` the probe reads unknown (HTTP 401) until the key is given from a file.
- llama-swap unloads every model for the render (a request in flight is cut, as its
  ``StopImmediately`` does) and loads it again on the next request.
- LocalAI refuses a busy shutdown with 500 after its grace: the release fails, says so,
  and is tried again; once the request ends the model is shut down, the request answered.
"""

from __future__ import annotations

import shutil
import threading
import urllib.error
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from arbiter_testing.node import HarnessNode
from arbiter_testing.tenants import diffusion_rule, http_json, start_diffusion, start_fake

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30
RENDER = {"prompt": {"1": {"class_type": "KSampler"}}}
CHAT = {"model": "qwen2.5-7b", "messages": [{"role": "user", "content": "hi"}]}


@contextmanager
def shipped_node(tmp_path: Path, rid: str, *rules: str) -> Iterator[HarnessNode]:
    """A node with the shipped ``rid`` rule (and ``rules``) as they are, on the fake reader."""
    (tmp_path / "vram.json").write_text("{}")
    node = HarnessNode(
        tmp_path, tick_s=0.5, stand_in_gpu=False, readers=[{"kind": "fake", "state_file": str(tmp_path / "vram.json")}]
    )
    for name in (rid, *rules):
        shutil.copy(ROOT / "tenants.d" / f"{name}.yaml", node.tenants / f"{name}.yaml")
    try:
        yield node
    finally:
        node.close()


def source(node: HarnessNode, rid: str) -> dict[str, Any]:
    found: dict[str, Any] = node.known_rule(rid)["sources"][0]
    return found


def reads(node: HarnessNode, rid: str, busy: bool | None, contains: str = "", timeout: float = 20) -> dict[str, Any]:
    """The rule's probe once the daemon reads it ``busy`` (None: unknown), its why holding ``contains``."""
    found: dict[str, Any] = node.wait_for(
        lambda: (s := source(node, rid))["busy"] is busy and contains in s["why"] and s, timeout=timeout
    )
    return found


def ask(url: str, body: dict[str, Any], into: list[Any]) -> None:
    try:
        http_json(url, body)
        into.append(200)
    except urllib.error.HTTPError as exc:
        into.append(exc.code)


def asking(url: str, body: dict[str, Any]) -> tuple[threading.Thread, list[Any]]:
    answers: list[Any] = []
    worker = threading.Thread(target=ask, args=(url, body, answers))
    worker.start()
    return worker, answers


def render_takes_the_short_time(node: HarnessNode, diffusion: dict[str, Any], rid: str) -> None:
    http_json(f"{diffusion['url']}/prompt", RENDER)
    node.wait_for(lambda: node.events("VRAM_RELEASED", subject=rid), timeout=60)
    run = node.wait_for(lambda: (runs := http_json(f"{diffusion['url']}/debug/runs")) and runs[0], timeout=60)
    assert run["took_s"] < 30, run
    reads(node, "diffusion-server", False)  # done: its memory is no longer wanted


# --- TGI -----------------------------------------------------------------------------------


def test_tgi_reads_idle_before_its_first_request_then_busy_while_it_generates(tmp_path: Path) -> None:
    with shipped_node(tmp_path, "tgi") as node:
        server = start_fake(node, tmp_path / "vram.json", tmp_path, "tgi", "--gen-s", "3")
        match = {"cmdline": ["fake_llm_servers tgi"]}
        node.add_rule("my-tgi", {"extends": "tgi", "match": match, "base_url": server["url"]})
        node.start()
        # its page has neither gauge yet: nothing runs, not "unknown"
        assert reads(node, "tgi", False)["readable"]
        worker, answers = asking(f"{server['url']}/generate", {"inputs": "hi", "parameters": {"max_new_tokens": 1}})
        reads(node, "tgi", True, "busy when > 0")
        worker.join(timeout=30)
        assert answers == [200]
        reads(node, "tgi", False)
        assert not node.known_rule("tgi")["reclaimable"]  # no release: a blocker, never asked


# --- llama-server --------------------------------------------------------------------------


def gauge(url: str, name: str) -> float:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as page:
        text = page.read().decode()
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(f"{name} "))


def test_llama_server_polled_by_arbiter_leaves_the_users_prometheus_its_throughput(tmp_path: Path) -> None:
    with shipped_node(tmp_path, "llama-server") as node:
        server = start_fake(node, tmp_path / "vram.json", tmp_path, "llamacpp", "--gen-s", "2")
        match = {"name": [], "cmdline": ["fake_llm_servers llamacpp"]}
        node.add_rule("my-llama", {"extends": "llama-server", "match": match, "base_url": server["url"]})
        node.start()
        reads(node, "llama-server", False)
        worker, answers = asking(f"{server['url']}/completion", {"prompt": "hi", "n_predict": 8})
        reads(node, "llama-server", True)
        worker.join(timeout=30)
        assert answers == [200]
        reads(node, "llama-server", False)  # the daemon polled it since the request ended
        # the user's own scrape: 8 tokens over 2 s since its last scrape, not an emptied window
        assert gauge(f"{server['url']}/metrics", "llamacpp:predicted_tokens_seconds") == 4.0


def test_llama_server_with_an_api_key_reads_unknown_until_the_key_comes_from_a_file(tmp_path: Path) -> None:
    key = tmp_path / "llama-server.auth"
    key.write_text("Bearer s3cret\n")
    key.chmod(0o600)
    with shipped_node(tmp_path, "llama-server") as node:
        server = start_fake(node, tmp_path / "vram.json", tmp_path, "llamacpp", "--api-key", "s3cret")
        rule = {
            "extends": "llama-server",
            "match": {"name": [], "cmdline": ["fake_llm_servers llamacpp"]},
            "base_url": server["url"],
        }
        node.add_rule("my-llama", rule)
        node.start()
        assert not reads(node, "llama-server", None, "401")["readable"]
        node.add_rule("my-llama", {**rule, "busy": {"headers": {"Authorization": {"from_file": str(key)}}}})
        assert reads(node, "llama-server", False)["readable"]


@pytest.mark.parametrize("busy", [True, False], ids=["busy", "idle"])
def test_llama_server_in_router_mode_reads_its_model_and_unloads_it_for_a_render(tmp_path: Path, busy: bool) -> None:
    model = "qwen2.5-7b"
    with shipped_node(tmp_path, "llama-server", "diffusion-server") as node:
        board = tmp_path / "vram.json"
        server = start_fake(node, board, tmp_path, "llamacpp", "--router", "--held-gb", "13", "--gen-s", "3")
        diffusion = start_diffusion(node, board, tmp_path, starved_s=30)
        rule: dict[str, Any] = {
            "extends": "llama-server",
            "match": {"name": [], "cmdline": ["fake_llm_servers llamacpp"]},
            "base_url": server["url"],
        }
        node.add_rule("my-llama", rule)
        node.add_rule("my-diffusion", diffusion_rule(diffusion))
        node.start()
        reads(node, "llama-server", None, "HTTP 400")  # the plain rule: unknown, and why
        # what the rule's comment says to write for a router serving one model
        node.add_rule(
            "my-llama",
            {
                **rule,
                "busy": {"url": f"/slots?model={model}"},
                "release": {"kind": "http_post", "url": "/models/unload", "body": {"model": model}, "timeout_s": 30},
            },
        )
        reads(node, "llama-server", False)
        http_json(f"{server['url']}/completion", {"model": model, "prompt": "hi"})  # loads it
        node.wait_for(lambda: node.known_rule("llama-server")["vram_bytes"] == 13 * GIB)
        if busy:
            worker, _ = asking(f"{server['url']}/completion", {"model": model, "prompt": "hi"})
            reads(node, "llama-server", True)
        render_takes_the_short_time(node, diffusion, "llama-server")
        if busy:
            worker.join(timeout=30)
        assert server["proc"].poll() is None
        http_json(f"{server['url']}/completion", {"model": model, "prompt": "again"})  # loaded again by itself
        node.wait_for(lambda: node.known_rule("llama-server")["vram_bytes"] == 13 * GIB)


# --- llama-swap ----------------------------------------------------------------------------


@pytest.mark.parametrize("busy", [True, False], ids=["busy", "idle"])
def test_llama_swap_unloads_every_model_for_a_render_and_loads_it_again(tmp_path: Path, busy: bool) -> None:
    with shipped_node(tmp_path, "llama-swap", "diffusion-server") as node:
        board = tmp_path / "vram.json"
        server = start_fake(node, board, tmp_path, "llama-swap", "--gen-s", "8" if busy else "0.1")
        diffusion = start_diffusion(node, board, tmp_path, needs_gb=12, starved_s=30)
        match = {"name": [], "cmdline": ["fake_model_swappers llama-swap"]}
        node.add_rule("my-swap", {"extends": "llama-swap", "match": match, "base_url": server["url"]})
        node.add_rule("my-diffusion", diffusion_rule(diffusion))
        node.start()
        reads(node, "llama-swap", False)  # nothing loaded
        chat = f"{server['url']}/v1/chat/completions"
        if busy:
            worker, answers = asking(chat, CHAT)
        else:
            http_json(chat, CHAT)
        # loaded, and listed by /running until it is stopped: busy, so reclaimable only by a handoff
        reads(node, "llama-swap", True)
        node.wait_for(lambda: node.known_rule("llama-swap")["vram_bytes"] == 6 * GIB)
        render_takes_the_short_time(node, diffusion, "llama-swap")
        if busy:
            worker.join(timeout=30)
            assert answers == [502]  # its upstream was stopped under it, as llama-swap does
        assert server["proc"].poll() is None
        again: list[Any] = []
        ask(chat, CHAT, again)
        assert again == [200]
        node.wait_for(lambda: node.known_rule("llama-swap")["vram_bytes"] == 6 * GIB)


# --- LocalAI -------------------------------------------------------------------------------


@pytest.mark.parametrize("busy", [True, False], ids=["busy", "idle"])
def test_localai_shuts_its_model_down_for_a_render_once_its_request_ends(tmp_path: Path, busy: bool) -> None:
    with shipped_node(tmp_path, "localai", "diffusion-server") as node:
        board = tmp_path / "vram.json"
        # a grace (and a release timeout that outlasts it) shorter than the real 30 s and 40 s
        args = ("--gen-s", "8" if busy else "0.1", "--busy-grace-s", "1")
        server = start_fake(node, board, tmp_path, "localai", *args)
        diffusion = start_diffusion(node, board, tmp_path, needs_gb=12, starved_s=40)
        match = {"name": [], "cmdline": ["fake_model_swappers localai"]}
        rule = {"extends": "localai", "match": match, "base_url": server["url"], "release": {"timeout_s": 2}}
        node.add_rule("my-localai", rule)
        node.add_rule("my-diffusion", diffusion_rule(diffusion))
        node.start()
        reads(node, "localai", False)
        chat = f"{server['url']}/v1/chat/completions"
        if busy:
            worker, answers = asking(chat, CHAT)
        else:
            http_json(chat, CHAT)
        node.wait_for(lambda: node.known_rule("localai")["vram_bytes"] == 6 * GIB)
        render_takes_the_short_time(node, diffusion, "localai")
        if busy:
            failed = node.events("VRAM_RELEASE_FAILED", subject="localai")
            assert "HTTP 500" in failed[0]["message"] and "failed to shutdown" in failed[0]["message"]
            worker.join(timeout=30)
            assert answers == [200]  # its request ended before its backend did
        assert server["proc"].poll() is None
        again: list[Any] = []
        ask(chat, CHAT, again)
        assert again == [200]
        node.wait_for(lambda: node.known_rule("localai")["vram_bytes"] == 6 * GIB)
