"""Releases that never break a server, end to end: the shipped SGLang and vLLM rules
(through ``extends:``, only their base_url, match and quiet period change) against fakes
that follow each server's source, a render short of VRAM beside them, and a request running
on the server when the render starts (or none).

- SGLang dies on a release while it answers a request: the shipped rule waits for the
  request to be answered, then pauses its generation (``retract``, so a request arriving
  meanwhile waits in its queue rather than being aborted) and releases it; on the way back it
  resumes its memory and lets it generate again, and the server lives on.
- vLLM aborts the requests in flight on a plain ``/sleep``: the shipped release asks it to
  let them finish first (``mode=wait``); the request is answered, not aborted.
"""

from __future__ import annotations

import re
import shutil
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from arbiter_testing.node import HarnessNode
from arbiter_testing.tenants import diffusion_rule, http_json, start_diffusion, start_fake

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30

SERVERS: dict[str, tuple[str, dict[str, Any], tuple[str, dict[str, Any]]]] = {
    "vllm": (
        "vllm",
        {"cmdline": ["arbiter_testing.fake_vllm"]},
        ("/v1/completions", {"model": "Qwen/Qwen2.5-7B-Instruct", "prompt": "hi", "max_tokens": 1}),
    ),
}
SGLANG_REQUEST = ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1}})


def http_text(url: str) -> str:
    """The running gauge's line when it reads above zero, else ""."""
    with urllib.request.urlopen(url, timeout=10) as page:
        text = page.read().decode()
    return "\n".join(line for line in text.splitlines() if "running" in line and not line.endswith(" 0.0"))


def answer(url: str, request: tuple[str, dict[str, Any]], into: list[Any]) -> None:
    try:
        body = http_json(f"{url}{request[0]}", request[1])
        into.append(200 if "meta_info" not in body else body["meta_info"]["finish_reason"]["type"])
    except urllib.error.HTTPError as exc:
        into.append(exc.code)
    except OSError:
        into.append(0)  # the server went away


@pytest.mark.parametrize("rid", sorted(SERVERS))
def test_a_busy_server_is_released_for_a_render_without_breaking_it_or_its_request(tmp_path: Path, rid: str) -> None:
    program, match, request = SERVERS[rid]
    busy_gauge = "num_requests_running{"
    (tmp_path / "vram.json").write_text("{}")
    node = HarnessNode(
        tmp_path, tick_s=0.5, stand_in_gpu=False, readers=[{"kind": "fake", "state_file": str(tmp_path / "vram.json")}]
    )
    for name in (rid, "diffusion-server"):
        shutil.copy(ROOT / "tenants.d" / f"{name}.yaml", node.tenants / f"{name}.yaml")
    try:
        board = tmp_path / "vram.json"
        server = start_fake(node, board, tmp_path, program, "--held-gb", "13", "--gen-s", "4")
        diffusion = start_diffusion(node, board, tmp_path, starved_s=30)
        node.add_rule(f"my-{rid}", {"extends": rid, "match": match, "base_url": server["url"], "reacquire_after_s": 1})
        node.add_rule("my-diffusion", diffusion_rule(diffusion))
        node.start()
        node.wait_for(lambda: node.known_rule(rid)["vram_bytes"] == 13 * GIB)
        answers: list[int] = []
        worker = threading.Thread(target=answer, args=(server["url"], request, answers))
        worker.start()
        # running on the server (the daemon's probe may not have read it yet: the release must
        # not trust a reading taken before the request came)
        node.wait_for(lambda: busy_gauge in http_text(f"{server['url']}/metrics"), timeout=10)
        http_json(f"{diffusion['url']}/prompt", {"prompt": {"1": {"class_type": "KSampler"}}})
        worker.join(timeout=30)
        assert answers == [200]  # its request was answered, not aborted nor cut by its death
        node.wait_for(lambda: node.events("VRAM_RELEASED", subject=rid), timeout=30)
        run = node.wait_for(lambda: (runs := http_json(f"{diffusion['url']}/debug/runs")) and runs[0], timeout=40)
        assert run["took_s"] < 30
        assert server["proc"].poll() is None  # the server lives
        node.wait_for(lambda: node.events("VRAM_REACQUIRED", subject=rid), timeout=30)
        done: list[int] = []
        answer(server["url"], request, done)
        assert done == [200]
    finally:
        node.close()


@pytest.mark.parametrize("busy", [True, False], ids=["busy", "idle"])
def test_sglang_is_drained_paused_then_released_for_a_render_and_lives_on(tmp_path: Path, busy: bool) -> None:
    (tmp_path / "vram.json").write_text("{}")
    node = HarnessNode(
        tmp_path, tick_s=0.5, stand_in_gpu=False, readers=[{"kind": "fake", "state_file": str(tmp_path / "vram.json")}]
    )
    for name in ("sglang", "diffusion-server"):
        shutil.copy(ROOT / "tenants.d" / f"{name}.yaml", node.tenants / f"{name}.yaml")
    try:
        board = tmp_path / "vram.json"
        server = start_fake(node, board, tmp_path, "sglang", "--held-gb", "13", "--gen-s", "8")
        diffusion = start_diffusion(node, board, tmp_path, starved_s=30)
        match = {"cmdline": ["fake_llm_servers sglang"]}
        node.add_rule(
            "my-sglang", {"extends": "sglang", "match": match, "base_url": server["url"], "reacquire_after_s": 1}
        )
        node.add_rule("my-diffusion", diffusion_rule(diffusion))
        node.start()
        node.wait_for(lambda: node.known_rule("sglang")["vram_bytes"] == 13 * GIB)
        answers: list[Any] = []
        worker = threading.Thread(target=answer, args=(server["url"], SGLANG_REQUEST, answers))
        if busy:
            worker.start()
            # running, not only its gauge shown: the gauge is there, at 0, before the request
            running = re.compile(r"num_running_reqs\{[^}]*\} [1-9]")
            node.wait_for(lambda: running.search(http_text(f"{server['url']}/metrics")), timeout=10)
        http_json(f"{diffusion['url']}/prompt", {"prompt": {"1": {"class_type": "KSampler"}}})
        node.wait_for(lambda: node.events("VRAM_RELEASED", subject="sglang"), timeout=30)
        if busy:
            # drained first: the request was answered (its answer reaches the client a moment
            # after the server goes idle) and the release that followed left the server alive
            worker.join(timeout=30)
            assert answers == ["length"]
            assert node.events("VRAM_RELEASE_DRAINING", subject="sglang")
        assert server["proc"].poll() is None  # the server lives
        run = node.wait_for(lambda: (runs := http_json(f"{diffusion['url']}/debug/runs")) and runs[0], timeout=40)
        assert run["took_s"] < 30
        node.wait_for(lambda: node.events("VRAM_REACQUIRED", subject="sglang"), timeout=30)
        done: list[Any] = []
        answer(server["url"], SGLANG_REQUEST, done)
        assert done == ["length"]
        assert server["proc"].poll() is None
    finally:
        node.close()
